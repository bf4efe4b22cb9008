"""What the engine's CPU kernels give: the batched step (pipeline.engine.paged) as it runs (pipeline.decode_step.cpu.matmul's
kernel per row count: pipeline/decode_step/cpu/cpu_decode.c for 1-64 rows where it is built; decode-only passes through
pipeline.decode_step.cpu.row_step), the torch step with cpu_matmul's kernels, and the torch step with F.linear everywhere, on the
loaded model, interleaved repeats. (The fallback kernels, without cpu_decode.c, are measured in their own
processes by bench/bench_cpu_anchor.py: switching OpenMP and OpenBLAS thread pools within one process slows both.)

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
    from pipeline.decode_step.choice import CHOICE
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
    # (the kernel choice on, the row step for decode-only passes on)
    layouts = {"cpu_matmul + row step": (True, True), "cpu_matmul, torch step": (True, False), "F.linear": (False, False)}
    defaults = (CHOICE.enabled, True)
    row = step.row
    times = {(c, k): [] for c in cases for k in layouts}
    diff = {}
    try:
        with torch.inference_mode():
            for c, seqs in cases.items():  # the logits of both layouts, once
                out = {}
                for k, lay in layouts.items():
                    CHOICE.enabled, use_row = lay
                    step.row = row if use_row else None
                    out[k] = step.forward(seqs)
                diff[c] = {k: float((out[k] - out["F.linear"]).abs().max() / out["F.linear"].abs().max()) for k in layouts if k != "F.linear"}
            order = list(layouts.items())
            for rep in range(args.reps):  # interleaved: every case and layout once per repeat, the layouts' order rotating
                for c, seqs in cases.items():
                    for k, lay in order[rep % len(order) :] + order[: rep % len(order)]:
                        CHOICE.enabled, use_row = lay
                        step.row = row if use_row else None
                        t = time.perf_counter()
                        step.forward(seqs)
                        times[(c, k)].append(time.perf_counter() - t)
    finally:
        CHOICE.enabled, _ = defaults
        step.row = row
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
