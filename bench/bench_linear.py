"""What the engine's CPU matmul layout gives: the batched step (pipeline.engine.paged) with every projection as
W @ xᵀ (pipeline.fused.linear, the default; 9-15 rows padded to 16), the same without the padding, and F.linear's
x @ Wᵀ, on the loaded model, interleaved repeats. Both W @ xᵀ layouts are measured at every row count here, past
the default's cut-over to F.linear (fused.TALL_WEIGHT_MAX_ROWS), to show why it is there.

Cases: 1, 8 and 12 decode rows (contexts around 60), a 36-token prompt chunk alone and with 7 decode rows (what
an arrival costs the others), and 7 prompts of 36 tokens at once. Medians and spread in ms, the ratio
F.linear / W @ xᵀ per case (above 1: W @ xᵀ is faster), and each layout's logits against F.linear's.

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
    tables = [pool.take(pool.blocks_for(160)) for _ in range(13)]
    prompt = list(range(200, 236))
    with torch.inference_mode():
        for t in tables:  # 60 tokens of context in each request's blocks
            step.forward([Seq(list(range(100, 160)), 0, t)])
    decode = [Seq([5], 60 + j, tables[j]) for j in range(12)]
    cases = {
        "decode, 1 row": decode[:1],
        "decode, 8 rows": decode[:8],
        "decode, 12 rows": decode,
        "prompt chunk of 36 tokens": [Seq(prompt, 0, tables[12])],
        "prompt chunk of 36 + 7 decode rows": [Seq(prompt, 0, tables[12])] + decode[:7],
        "7 prompts of 36 tokens": [Seq(prompt, 0, tables[j]) for j in range(7)],
    }
    # (W @ xT on, rows padded up to, most rows it takes)
    layouts = {"W @ xT": (True, fused.TALL_WEIGHT_PAD_TO, 10**9), "W @ xT unpadded": (True, 0, 10**9), "F.linear": (False, 0, 0)}
    defaults = (fused.TALL_WEIGHT_KERNEL, fused.TALL_WEIGHT_PAD_TO, fused.TALL_WEIGHT_MAX_ROWS)
    times = {(c, k): [] for c in cases for k in layouts}
    diff = {}
    try:
        with torch.inference_mode():
            for c, seqs in cases.items():  # the logits of both layouts, once
                out = {}
                for k, lay in layouts.items():
                    fused.TALL_WEIGHT_KERNEL, fused.TALL_WEIGHT_PAD_TO, fused.TALL_WEIGHT_MAX_ROWS = lay
                    out[k] = step.forward(seqs)
                diff[c] = {k: float((out[k] - out["F.linear"]).abs().max() / out["F.linear"].abs().max()) for k in layouts if k != "F.linear"}
            order = list(layouts.items())
            for rep in range(args.reps):  # interleaved: every case and layout once per repeat, the layouts' order rotating
                for c, seqs in cases.items():
                    for k, lay in order[rep % len(order) :] + order[: rep % len(order)]:
                        fused.TALL_WEIGHT_KERNEL, fused.TALL_WEIGHT_PAD_TO, fused.TALL_WEIGHT_MAX_ROWS = lay
                        t = time.perf_counter()
                        step.forward(seqs)
                        times[(c, k)].append(time.perf_counter() - t)
    finally:
        fused.TALL_WEIGHT_KERNEL, fused.TALL_WEIGHT_PAD_TO, fused.TALL_WEIGHT_MAX_ROWS = defaults
    results = {}
    for c in cases:
        row = {}
        for k in layouts:
            xs = sorted(times[(c, k)])
            row[k] = {"median_ms": round(statistics.median(xs) * 1000, 1), "min_ms": round(xs[0] * 1000, 1), "max_ms": round(xs[-1] * 1000, 1)}
        for k in layouts:
            if k != "F.linear":
                row[f"ratio_F.linear_over_{k.replace(' ', '')}"] = round(row["F.linear"]["median_ms"] / row[k]["median_ms"], 2)
        row["logits_max_rel_diff_vs_F.linear"] = diff[c]
        results[c] = row
    write("linear", {"model": lm.label, "device": lm.device_label, "reps": args.reps, "results": results})


if __name__ == "__main__":
    main()
