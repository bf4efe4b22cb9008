"""Production mode on the embedded model, measured in one run: greedy decode tokens/s of the dynamic-cache
loop, transformers' static cache, our fused static-shape step (a CUDA graph on CUDA) and, with --compile, the
fused step compiled by torch.compile; ratios to the dynamic loop, same-token checks, the fused step alone back
to back (device floor), operators per step, and the fused step's logits against a plain forward.

    .venv/bin/python bench/bench_production.py [--tokens 64] [--reps 5] [--compile]
"""

import argparse
import time
from dataclasses import asdict

from common import write


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--compile", action="store_true", help="also torch.compile the fused step (about a minute)")
    args = ap.parse_args()
    import pipeline
    from pipeline.decode_step import fused_measures as fused
    from pipeline.generation import compare_cache_modes, metrics

    lm = pipeline.load_model()
    prompt = "Why is the sky blue?"
    modes = ("dynamic", "static", "fused") + (("fused+compile",) if args.compile else ())
    t = time.perf_counter()
    res = compare_cache_modes(lm, prompt, args.tokens, chat=True, reps=args.reps, modes=modes)
    out = {
        m: {
            "tokens_per_s": round(r.tokens_per_s, 2),
            "ratio_vs_dynamic": round(res.ratio(m), 3),  # median of the per-repeat ratios
            "ratio_range": [round(x, 3) for x in res.ratios(m).spread],
            "noisy": res.ratios(m).noisy if m != "dynamic" else None,
            "tpot_ms": round(metrics(r.events).tpot_s * 1000, 2),
            "warmup_s": round(r.warmup_s, 2),
            "same_tokens_as_dynamic": res.same_tokens(m),
        }
        for m, r in res.modes.items()
    }
    floor = fused.step_floor(lm, 30)
    ids = lm.tokenizer("The capital of France is Paris, and the capital of Italy is")["input_ids"]
    write(
        "production",
        {
            "model": lm.label,
            "device": lm.device_label,
            "fused_mode": fused.mode_label(lm),
            "new_tokens": args.tokens,
            "reps": args.reps,
            "modes": out,
            "fused_step_floor": {k: round(v, 3) if isinstance(v, float) else v for k, v in asdict(floor).items()},
            "host_ms_per_token_fused": round(out["fused"]["tpot_ms"] - floor.step_ms, 2),
            "launches_per_step": asdict(fused.launches_per_step(lm)),
            "fused_vs_forward": asdict(fused.check_against_forward(lm, ids)),
            "seconds": round(time.perf_counter() - t, 1),
        },
    )


if __name__ == "__main__":
    main()
