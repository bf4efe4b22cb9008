"""Faster inference, measured in one run: attention kernels over prompt lengths (time, peak memory,
agreement) and speculative decoding speedup per draft on a copy-style and an open-ended prompt (greedy,
interleaved with plain decoding, medians).

    .venv/bin/python bench/bench_faster.py [--tokens 48] [--reps 3]
"""

import argparse
import statistics
import time
from dataclasses import asdict

from common import write

COPY = "Rewrite this code with better names:\ndef f(a, b):\n    c = a + b\n    d = c * 2\n    e = [d] * 3\n    return e\n"
OPEN = "Write a short story about a lighthouse keeper."


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    import pipeline
    from pipeline.generation import generate
    from pipeline.generation.speculative import expected_tokens_per_call, speculative_generate
    from pipeline.lab.attention_kernels import kernel_sweep

    lm = pipeline.load_model()
    gpu = lm.device.type == "cuda"
    kernels = kernel_sweep(lm, [512, 1024, 2048, 4096, 8192] if gpu else [256, 512, 1024, 2048])
    L = lm.facts.n_layers
    spec = {}
    for pname, prompt in (("copy-style", COPY), ("open-ended", OPEN)):
        generate_args = dict(chat=True)
        list(generate(lm, prompt, 4, **generate_args))
        for draft in ("prompt_lookup", f"early_exit:{L // 4}", f"early_exit:{L // 2}"):
            plain_t, spec_t, res = [], [], None
            for _ in range(args.reps):
                t = time.perf_counter()
                plain = [e.token_id for e in generate(lm, prompt, args.tokens, **generate_args)]
                plain_t.append(time.perf_counter() - t)
                res = speculative_generate(lm, prompt, draft, gamma=4, max_new_tokens=args.tokens, chat=True)
                spec_t.append(res.seconds)
            a = res.acceptance_rate
            spec[f"{pname} / {draft}"] = {
                "speedup": round(statistics.median(plain_t) / statistics.median(spec_t), 3),
                "acceptance_rate": round(a, 3),
                "mean_accepted_per_call": round(res.mean_accepted, 2),
                "tokens_per_target_call": round(len(res.tokens) / res.target_calls, 2),
                "expected_tokens_per_call": round(expected_tokens_per_call(a, 4), 2),
                "identical_to_plain_greedy": res.tokens == plain,
                "tokens": len(res.tokens),
            }
    write(
        "faster",
        {
            "model": lm.label,
            "device": lm.device_label,
            "gamma": 4,
            "attention_kernels": [{k: (round(v, 5) if isinstance(v, float) else v) for k, v in asdict(r).items()} for r in kernels],
            "speculative": spec,
        },
    )


if __name__ == "__main__":
    main()
