"""What exactness costs (issue 34): with pipeline/decode_step/cpu/cpu_decode.c every pass of the CPU engine goes through the row
step, whose products run in a fixed order for any number of rows (the panel kernel), so a request's numbers do not
depend on what shares its passes. Decode passes took that path already; prompt chunks used torch (MKL above 64 rows,
SDPA), which is faster for many rows but sums in an order that depends on the pass. Measured here: one prompt's
prefill of N tokens, and a pass of one 64-token chunk beside 8 decode rows, both ways, interleaved in the same
process (median and spread of --reps); the same logits checked on the exact side (a chunk's last row alone and
beside others, bit for bit).

    .venv/bin/python bench/bench_exact.py [--model smollm2-135m-instruct] [--reps 7] [--lengths 16,64,256]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from common import write


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--lengths", default="16,64,256")
    args = ap.parse_args()
    import pipeline
    from pipeline.decode_step.choice import CHOICE
    from pipeline.engine.paged import PagedKV, PagedStep, Seq
    from pipeline.generation import long_prompt
    from pipeline.model import load_model

    if not CHOICE.c_kernels():
        raise SystemExit("pipeline/decode_step/cpu/cpu_decode.c is not built here: there is no exact path to measure")
    lm = load_model(args.model or pipeline.EMBEDDED)
    kv = PagedKV(lm, 512, 8)
    step = PagedStep(lm, kv)

    def torch_pass(seqs):  # the torch path, as every pass with a prompt chunk ran before (the row step off)
        row, step.row = step.row, None
        try:
            return step.forward(seqs)
        finally:
            step.row = row

    ids = lm.tokenizer(long_prompt(lm, 600))["input_ids"]
    decode_tables = [list(range(400 + 8 * j, 408 + 8 * j)) for j in range(8)]
    results, checks = {}, {}
    with lm.lock, torch.inference_mode():
        for j, t in enumerate(decode_tables):  # 8 requests with 40 tokens of context each, for the mixed pass
            step.forward([Seq(ids[100 + j : 140 + j], 0, t)])
        cases = {f"prefill {n} tokens": (lambda n=n: [Seq(ids[:n], 0, list(range(0, -(-n // 8))))]) for n in map(int, args.lengths.split(","))}
        cases["a 64-token chunk beside 8 decode rows"] = lambda: (
            [Seq(ids[:64], 0, list(range(8)))] + [Seq([ids[200 + j]], 40, t) for j, t in enumerate(decode_tables)]
        )
        for name, make in cases.items():
            for f in (step.forward, torch_pass):  # warm-up, outside the measured set
                f(make())
            times = {"exact (row step)": [], "torch": []}
            for _ in range(args.reps):
                for label, f in (("exact (row step)", step.forward), ("torch", torch_pass)):
                    t0 = time.perf_counter()
                    f(make())
                    times[label].append(time.perf_counter() - t0)
            med = {k: statistics.median(v) for k, v in times.items()}
            results[name] = {
                **{k: {"median_ms": round(1000 * med[k], 1), "min_ms": round(1000 * min(v), 1), "max_ms": round(1000 * max(v), 1)} for k, v in times.items()},
                "exact_over_torch": round(med["exact (row step)"] / med["torch"], 2),
            }
            print(name, results[name], flush=True)
        # the exact side's promise on these very passes: a chunk's last logits alone = beside the decode rows
        alone = step.forward([Seq(ids[:64], 0, list(range(8)))])[0]
        mixed = step.forward(cases["a 64-token chunk beside 8 decode rows"]())[0]
        checks["chunk_alone_equals_beside_8_decode_rows_bit_for_bit"] = bool(torch.equal(alone, mixed))
        t_alone, t_mixed = torch_pass([Seq(ids[:64], 0, list(range(8)))])[0], torch_pass(cases["a 64-token chunk beside 8 decode rows"]())[0]
        checks["torch_path_largest_difference"] = float((t_alone - t_mixed).abs().max())
    write(f"exact_{lm.key.split('-')[0]}", {"model": lm.key, "reps": args.reps, "passes": results, "checks": checks})


if __name__ == "__main__":
    main()
