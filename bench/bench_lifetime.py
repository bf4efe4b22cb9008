"""Memory over load/use/drop cycles in one process: load a model, one generation through the shared engine and one
through our own fused loop, drop it, collect; RSS after each cycle. Before the fix (2026-12-02) every cycle kept
its model and copies: 1,955 -> 3,533 -> 5,113 -> 6,692 MB.

    python bench/bench_lifetime.py [--model smollm2-135m-instruct] [--cycles 3] [--out lifetime]

Writes bench/results/<out>.json: rss_mb per cycle, the growth over the cycles after the first, what each answered.
tests/pipeline/test_lifetime.py runs it with small numbers and asserts the growth stays under 200 MB.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import sys
import time
import weakref
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402

import pipeline  # noqa: E402
from pipeline import (
    generation,  # noqa: E402
    serving,  # noqa: E402
)

PROMPT = "The capital of France is"


def rss_mb() -> float:
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed heap back to the system, so RSS says what is held
    except OSError:
        pass
    return psutil.Process().memory_info().rss / 2**20


def cycle(key: str, tokens: int) -> tuple[str, str, weakref.ref]:
    lm = pipeline.load_model(key)
    prep = generation.prepare(lm, PROMPT, tokens)
    engine_text = "".join(ev.text for ev in serving.stream(lm, prep, pipeline.GREEDY) if isinstance(ev, pipeline.StepEvent))
    fused_text = "".join(ev.text for ev in generation.generate(lm, PROMPT, tokens, request=prep, cache="fused"))
    return engine_text, fused_text, weakref.ref(lm)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=pipeline.EMBEDDED)
    ap.add_argument("--cycles", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=8)
    ap.add_argument("--out", default="lifetime")
    ap.add_argument("--json", action="store_true", help="print the result as JSON (no file)")
    a = ap.parse_args(argv)
    before = rss_mb()
    rows = []
    for i in range(a.cycles):
        t = time.perf_counter()
        eng, fused, ref = cycle(a.model, a.tokens)
        gc.collect()  # at once: nothing else may hold the model (the engine's idle worker holds only its scheduler)
        rows.append(
            {"cycle": i + 1, "rss_mb": round(rss_mb(), 1), "freed": ref() is None, "engine": eng, "fused": fused, "s": round(time.perf_counter() - t, 1)}
        )
        print(json.dumps(rows[-1]), file=sys.stderr)
    out = {
        "model": a.model,
        "before_mb": round(before, 1),
        "cycles": rows,
        "growth_after_first_mb": round(rows[-1]["rss_mb"] - rows[0]["rss_mb"], 1),
        "all_freed": all(r["freed"] for r in rows),
    }
    if a.json:
        print(json.dumps(out))
    else:
        path = Path(__file__).parent / "results" / f"{a.out}.json"
        path.write_text(json.dumps(out, indent=1))
        print(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
