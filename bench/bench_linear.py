"""What the engine's CPU matmul layout gives: the batched step (pipeline.engine.paged) with every projection as
W @ xᵀ (pipeline.fused.linear, the default) against F.linear's x @ Wᵀ, on the loaded model, interleaved repeats.

Cases: 1 and 8 decode rows (contexts around 60), a 36-token prompt chunk alone and with 7 decode rows (what an
arrival costs the others), and 7 prompts of 36 tokens at once. Medians and spread in ms, and the ratio
F.linear / W @ xᵀ per case (above 1: the default is faster). The two layouts' logits are compared too.

    .venv/bin/python bench/bench_linear.py [--reps 7] [--model smollm2]
"""

import argparse
import statistics
import time

from common import write


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--model", default=None, help="a model key (default: the embedded SmolLM2)")
    args = ap.parse_args()
    import torch

    import pipeline
    import pipeline.fused as fused
    from pipeline.engine import Engine
    from pipeline.engine.paged import Seq

    lm = pipeline.load_model(args.model) if args.model else pipeline.load_model()
    eng = Engine(lm, background=False)
    step, pool = eng.step, eng.scheduler.pool
    tables = [pool.take(pool.blocks_for(160)) for _ in range(9)]
    prompt = list(range(200, 236))
    with torch.inference_mode():
        for t in tables:  # 60 tokens of context in each request's blocks
            step.forward([Seq(list(range(100, 160)), 0, t)])
    decode = [Seq([5], 60 + j, tables[j]) for j in range(8)]
    cases = {
        "decode, 1 row": decode[:1],
        "decode, 8 rows": decode,
        "prompt chunk of 36 tokens": [Seq(prompt, 0, tables[8])],
        "prompt chunk of 36 + 7 decode rows": [Seq(prompt, 0, tables[8])] + decode[:7],
        "7 prompts of 36 tokens": [Seq(prompt, 0, tables[j]) for j in range(7)],
    }
    layouts = {"W @ xT": True, "F.linear": False}
    times = {(c, k): [] for c in cases for k in layouts}
    diff = {}
    try:
        with torch.inference_mode():
            for c, seqs in cases.items():  # the logits of both layouts, once
                out = {}
                for k, on in layouts.items():
                    fused.TALL_WEIGHT_KERNEL = on
                    out[k] = step.forward(seqs)
                diff[c] = float((out["W @ xT"] - out["F.linear"]).abs().max() / out["F.linear"].abs().max())
            for _ in range(args.reps):  # interleaved: every case and layout once per repeat
                for c, seqs in cases.items():
                    for k, on in layouts.items():
                        fused.TALL_WEIGHT_KERNEL = on
                        t = time.perf_counter()
                        step.forward(seqs)
                        times[(c, k)].append(time.perf_counter() - t)
    finally:
        fused.TALL_WEIGHT_KERNEL = True
    results = {}
    for c in cases:
        row = {}
        for k in layouts:
            xs = sorted(times[(c, k)])
            row[k] = {"median_ms": round(statistics.median(xs) * 1000, 1), "min_ms": round(xs[0] * 1000, 1), "max_ms": round(xs[-1] * 1000, 1)}
        row["ratio_F.linear_over_W@xT"] = round(row["F.linear"]["median_ms"] / row["W @ xT"]["median_ms"], 2)
        row["logits_max_rel_diff"] = diff[c]
        results[c] = row
    write("linear", {"model": lm.label, "device": lm.device_label, "reps": args.reps, "results": results})


if __name__ == "__main__":
    main()
