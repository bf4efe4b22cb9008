"""A trace of every stage against the model's own forward, at 37, 1,024, 4,096 and ~8,000 tokens (SmolLM2-135M, fp32,
held-out prose; the trace since issue 56 runs SDPA and keeps queries and keys, computing maps when read). Both sides
alike: the same token ids (the trace given them already tokenized), `use_cache=False`, the LM head on the last
position only, the same threads (pipeline.model.threads_for); the trace's time is its whole call (hooks, the kept
activations copied out, the last rows, the logit lens, the trace assembled). Alternated, warm-ups outside the measured
set, median with the spread (min, max) of each side and of the per-pair ratio. Goal: <= 1.15 at every length.
Also: the trace's memory (what it keeps, before any map is read) and the time to read one layer's pooled map and the
all-layer overview afterwards (what the attention page asks for).

    .venv/bin/python bench/bench_long_trace.py [--lengths 37,1024,4096,8000] [--reps N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import write  # noqa: E402

SENTENCE = "Rayleigh scattering sends the short blue wavelengths of sunlight across the sky in every direction, number {}. "


def prose(tok, n: int) -> str:
    """Plain prose of about n tokens (a few over)."""
    k = max(1, n // len(tok(SENTENCE.format(100))["input_ids"]))
    while len(tok("".join(SENTENCE.format(100 + i) for i in range(k)))["input_ids"]) < n:
        k += 1
    return "".join(SENTENCE.format(100 + i) for i in range(k))


def spread(xs: list[float], digits: int = 3) -> dict:
    return {"median": round(statistics.median(xs), digits), "min": round(min(xs), digits), "max": round(max(xs), digits), "n": len(xs)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="37,1024,4096,8000")
    ap.add_argument("--reps", type=int, default=0, help="pairs per length (0: 15 short, 5 at 1k, 3 at 4k and over)")
    ap.add_argument("--out", default="long_trace")
    args = ap.parse_args()
    import torch

    import pipeline
    from pipeline.forward.tokens import tokenize
    from pipeline.model.loaded import threads_for

    lm = pipeline.load_model()
    rows = {}
    for n in [int(x) for x in args.lengths.split(",")]:
        if n <= 40:
            tk = tokenize(lm.tokenizer, "Why is the sky blue?", chat=True)  # the article's example, ~37 tokens with the template
        else:
            text = prose(lm.tokenizer, n)
            tk = tokenize(lm.tokenizer, text)
        T = len(tk.input_ids)
        ids = torch.tensor([tk.input_ids])

        def forward():
            with lm.lock, torch.inference_mode(), threads_for(lm.device, T):
                t = time.perf_counter()
                lm.model(input_ids=ids, logits_to_keep=1, use_cache=False)
                return time.perf_counter() - t

        def traced():
            t = time.perf_counter()
            tr = pipeline.trace(lm, tk.prompt, chat=tk.chat, tokenized=tk)
            return time.perf_counter() - t, tr

        forward()
        traced()  # warm-ups, outside the measured set
        reps = args.reps or (15 if T <= 256 else 5 if T <= 2048 else 3)
        fw, tw, ratios = [], [], []
        tr = None
        for i in range(reps):  # alternated, which goes first alternating too
            if i % 2:
                t_tr, tr = traced()
                t_fw = forward()
            else:
                t_fw = forward()
                t_tr, tr = traced()
            fw.append(t_fw)
            tw.append(t_tr)
            ratios.append(t_tr / t_fw)
        kept = tr.nbytes
        t = time.perf_counter()
        tr.acts[f"blocks.{lm.facts.n_layers // 2}.attn.hook_pattern|pooled"]
        one_layer = time.perf_counter() - t
        t = time.perf_counter()
        tr.acts["blocks.*.attn.hook_pattern|pooled"]
        overview = time.perf_counter() - t
        rows[str(n)] = {
            "tokens": T,
            "forward_s": spread(fw),
            "trace_s": spread(tw),
            "ratio": spread(ratios),
            "trace_kept_mb": round(kept / 2**20, 1),
            "one_layer_pooled_map_s": round(one_layer, 3),
            "all_layers_overview_s": round(overview, 3),
            "attention_block": tr.acts.attn_block,
        }
        print(n, rows[str(n)], flush=True)
        del tr
    write(args.out, {"model": lm.label, "device": lm.device_label, "goal_ratio": 1.15, "lengths": rows})


if __name__ == "__main__":
    main()
