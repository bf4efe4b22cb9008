"""Trace of all stages vs a plain forward (ratio, goal <= 1.25), re-filter latency after a slider change
(goal < 50 ms), cold and warm model load. Ratios are taken in one run, interleaved, medians of repeats.

    .venv/bin/python bench/bench_trace.py [--reps 7]
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time

from common import write

LOAD = "import time; t=time.perf_counter(); import pipeline; lm=pipeline.load_model(); print(time.perf_counter()-t)"


def load_time(cache: str) -> float:
    out = subprocess.run([sys.executable, "-c", LOAD], env={"LLM_EXPLORER_CACHE": cache, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    import numpy as np
    import torch

    import pipeline
    from pipeline.forward import sampling

    with tempfile.TemporaryDirectory() as cache:
        cold = load_time(cache)  # GGUF -> safetensors conversion, then load
        warm = [load_time(cache) for _ in range(2)]
    lm = pipeline.load_model()
    prompts = {
        "5 tokens": ("The capital of France is", False),
        "chat, ~36 tokens": ("Why is the sky blue?", True),
        "~120 tokens": ("Why is the sky blue? " * 20, False),
        "~500 tokens": ("The quick brown fox jumps over the lazy dog. " * 50, False),
    }
    rows = {}
    for name, (p, chat) in prompts.items():
        ids = torch.tensor([pipeline.tokenize(lm.tokenizer, p, chat=chat).input_ids])
        pipeline.trace(lm, p, chat=chat)
        with torch.inference_mode():
            lm.model(ids)
        tt, pt = [], []
        for _ in range(args.reps):
            t = time.perf_counter()
            tr = pipeline.trace(lm, p, chat=chat)
            tt.append(time.perf_counter() - t)
            with torch.inference_mode():
                t = time.perf_counter()
                lm.model(ids)  # plain forward: SDPA, no hooks, all-position logits
                pt.append(time.perf_counter() - t)
        mt, mp = statistics.median(tt), statistics.median(pt)
        rows[name] = {
            "tokens": tr.T,
            "trace_ms": round(mt * 1000, 2),
            "plain_forward_ms": round(mp * 1000, 2),
            "ratio": round(mt / mp, 3),
            "logit_lens_ms": round(tr.timings["logit lens"] * 1000, 2),
            "tokenize_ms": round(tr.timings["tokenize"] * 1000, 2),
        }

    tr = pipeline.trace(lm, "The capital of France is")
    settings = [(t, k, p, m) for t in (0.3, 0.7, 1.0, 1.5) for k in (0, 50) for p in (0.9, 1.0) for m in (0.0, 0.05)]
    lat = []
    for s in settings:
        t = time.perf_counter()
        steps = sampling.filter_steps(tr.next_logits, sampling.Sampling(*s))
        order = np.argsort(-steps[0].probs)[:15]
        _ = [st.probs[order] for st in steps]
        lat.append((time.perf_counter() - t) * 1000)
    write(
        "trace",
        {
            "model": lm.label,
            "device": lm.device_label,
            "trace_vs_plain_forward": rows,
            "goal_ratio": 1.25,
            "refilter_ms": {"median": round(statistics.median(lat), 2), "max": round(max(lat), 2), "settings": len(settings), "goal_ms": 50},
            "model_load_s": {"cold_gguf_convert_and_load": round(cold, 2), "warm_from_safetensors_cache": [round(w, 2) for w in warm]},
        },
    )


if __name__ == "__main__":
    main()
