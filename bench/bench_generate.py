"""Our instrumented decode loop vs transformers' generate on the same model, prompt and settings (greedy,
same number of tokens), tokens/s ratio in one run (goal >= 1.0); telemetry sampler overhead on decode speed
(goal < 2 %). Interleaved repeats, medians.

    .venv/bin/python bench/bench_generate.py [--tokens 48] [--reps 5]
"""

import argparse
import statistics
import time

from common import write


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    import torch

    import pipeline
    from pipeline.common.telemetry import Sampler
    from pipeline.generation import generate, metrics

    lm = pipeline.load_model()
    prompt = "Why is the sky blue?"
    ids = torch.tensor([pipeline.tokenize(lm.tokenizer, prompt, chat=True).input_ids], device=lm.device)
    n = args.tokens

    def ours():
        t = time.perf_counter()
        ev = list(generate(lm, prompt, n, chat=True))
        return len(ev), time.perf_counter() - t, ev

    def hf():
        t = time.perf_counter()
        with torch.inference_mode():
            out = lm.model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)
        return out.shape[1] - ids.shape[1], time.perf_counter() - t

    def ours_with_telemetry():
        with Sampler():
            return ours()

    ours(), hf()  # warm up
    r_ours, r_hf, r_tel = [], [], []
    for _ in range(args.reps):
        k, s, ev = ours()
        r_ours.append(k / s)
        k2, s2 = hf()
        r_hf.append(k2 / s2)
        k3, s3, ev3 = ours_with_telemetry()
        r_tel.append(k3 / s3)
    mo, mh, mt = statistics.median(r_ours), statistics.median(r_hf), statistics.median(r_tel)
    s = Sampler()
    s.__enter__()
    t = time.perf_counter()
    for _ in range(200):
        s._sample()
    per_sample = (time.perf_counter() - t) / 200
    s.__exit__(None, None, None)
    m = metrics(ev)
    write(
        "generate",
        {
            "model": lm.label,
            "device": lm.device_label,
            "new_tokens": n,
            "prompt_tokens": ids.shape[1],
            "tokens_per_s": {"ours_end_to_end": round(mo, 2), "transformers_generate": round(mh, 2), "ours_with_telemetry": round(mt, 2)},
            "ratio_ours_vs_generate": round(mo / mh, 3),
            "goal_ratio": 1.0,
            "telemetry_overhead_percent": round((mo - mt) / mo * 100, 2),
            "goal_overhead_percent": 2,
            "telemetry_sample_cost_us": round(per_sample * 1e6, 1),
            "telemetry_interval_s": s.interval_s,
            "telemetry_cpu_share_percent": round(per_sample / s.interval_s * 100, 3),
            "last_run": {
                "ttft_ms": round(m.ttft_s * 1000, 1),
                "tpot_ms": round((m.tpot_s or 0) * 1000, 2),
                "decode_tokens_per_s": round(m.tokens_per_s or 0, 2),
            },
            "note": "end-to-end tokens/s = generated tokens / wall time including tokenization and prefill, both loops",
        },
    )


if __name__ == "__main__":
    main()
