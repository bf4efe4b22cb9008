"""int8 weight-only serving on the CPU (issue 49, part 3) against our fp32 and CTranslate2's int8, in one run.

    .venv/bin/python bench/bench_int8.py [--reps 3] [--tokens 32]      -> bench/results/int8.json

Each configuration in its own fresh process, the configurations in a rotated order every repeat (interleaved: a slow
minute on a shared machine hits every configuration, not one), medians with min-max; warm-ups on prompts outside the
measured set (bench_cpu_anchor's house style, and its helpers):

  * engine-fp32-1 / engine-int8-1
                 the shared engine (its defaults: up to 8 greedy decode steps a pass) serving 1 request at a time, the
                 model loaded in fp32 and with `precision="int8"` (each projection and the LM head int8 per output row,
                 pipeline.model.quantised; cpu_decode.c's int8 panels): decode tokens/s (first token to last, prefill
                 excluded) over the 8 prompts one after another, the read probe's share beside it (bench_cpu_anchor's
                 ReadClock, fp32's weight bytes: for int8 a share above 1 is expected);
  * ct2-int8-1   CTranslate2 (compute_type="int8", the same safetensors converted with quantization="int8"), alone;
  * engine-int8-8 / ct2-int8-8
                 8 requests at once: generated tokens / wall time from the first submit to the last token (prefill
                 included), the engine with the prefix cache OFF as CTranslate2's static batch;
  * agreement    (once, untimed) int8's top-1 agreement with fp32 over 32 chat prompts: fp32's greedy answer (32
                 tokens, end-of-sequence off) through the fp32 engine, then each model's own forward over the prompt and
                 that answer (teacher forcing): the share of answer positions where int8's greedy choice is fp32's token.

The prompts: chat prompts "Name N colours and one thing of each colour." (N = 2..9; N = 2..33 for the agreement).
CTranslate2 is a bench-only dependency (`pip install ctranslate2`); its configurations are skipped when it is absent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

TIMED = ("engine-fp32-1", "engine-int8-1", "engine-int8-8")
CT2 = ("ct2-int8-1", "ct2-int8-8")


def agreement(tokens: int, n: int = 32) -> dict:
    """int8's top-1 agreement with fp32, teacher-forced on fp32's greedy answers through its engine (see the module)."""
    import torch
    from bench_cpu_anchor import prompts

    import pipeline
    from pipeline.engine import Engine
    from pipeline.generation.events import StepEvent

    fp32, int8 = pipeline.load_model(), pipeline.load_model(precision="int8")
    ps = prompts(fp32, n, tokens)
    eng = Engine(fp32, prefix_cache=False)
    answers = [[e.token_id for e in h if isinstance(e, StepEvent)] for h in [eng.submit(p, tokens, stop_ids=set()) for p in ps]]
    agree = total = 0
    worst, flips_at = 0.0, []
    with torch.inference_mode():
        for p, a in zip(ps, answers):
            ids = torch.tensor([p + a[:-1]])
            lf, li = (lm.model(input_ids=ids, use_cache=False).logits[0, len(p) - 1 :] for lm in (fp32, int8))
            same = li.argmax(-1) == torch.tensor(a)
            agree += int(same.sum())
            total += len(a)
            worst = max(worst, float((lf - li).abs().max()))
            flips_at.append(int((~same).nonzero()[0]) if not same.all() else None)
    return {
        "top1_agreement": agree / total,
        "positions": total,
        "prompts": len(ps),
        "answers_without_a_flip": sum(f is None for f in flips_at),
        "max_logit_diff": worst,
    }


def worker(config: str, tokens: int) -> dict:
    from bench_cpu_anchor import ct2, engine_batch, ours, prompts

    import pipeline

    if config == "agreement":
        return agreement(tokens)
    lm = pipeline.load_model(precision="int8" if "-int8-" in config and config.startswith("engine") else "fp32")
    _, kind, k = config.split("-")
    ps = prompts(lm, int(k) if int(k) > 1 else 8, tokens)
    if config.startswith("ct2-"):
        return ct2(lm, kind, int(k), ps, tokens)
    if k == "1":
        return ours(lm, "engine", ps, tokens)
    return engine_batch(lm, ps, tokens, prefix_cache=False)


def run_one(config: str, tokens: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out.json"
        t = time.perf_counter()
        r = subprocess.run([sys.executable, __file__, "--worker", config, "--tokens", str(tokens), "--out", str(out)], capture_output=True, text=True)
        if r.returncode and not out.exists():
            return {"error": (r.stderr or r.stdout)[-800:]}
        res = json.loads(out.read_text())
        res["process_s"] = time.perf_counter() - t
        return res


def summarise(results: dict, agree: dict) -> dict:
    def med(c, k):
        return results.get(c, {}).get(k, {}).get("median")

    def ratio(a, b):
        return a / b if a and b else None

    fp32, int8, ct2_1 = med("engine-fp32-1", "decode_tokens_per_s"), med("engine-int8-1", "decode_tokens_per_s"), med("ct2-int8-1", "decode_tokens_per_s")
    int8_8, ct2_8 = med("engine-int8-8", "tokens_per_s"), med("ct2-int8-8", "tokens_per_s")
    return {
        "engine_fp32_alone_decode_tokens_per_s": fp32,
        "engine_int8_alone_decode_tokens_per_s": int8,
        "ct2_int8_alone_decode_tokens_per_s": ct2_1,
        "int8_over_fp32_alone": ratio(int8, fp32),
        "int8_over_ct2_int8_alone": ratio(int8, ct2_1),
        "engine_int8_8_tokens_per_s": int8_8,
        "ct2_int8_batch_8_tokens_per_s": ct2_8,
        "int8_8_over_ct2_int8_batch_8": ratio(int8_8, ct2_8),
        "int8_top1_agreement_with_fp32": agree.get("top1_agreement"),
        "issue_49_targets": {"int8_over_fp32_alone": 1.7, "int8_over_ct2_int8_alone": 1.2, "int8_8_over_ct2_int8_batch_8": 1.3},
    }


def main(argv=None) -> int:
    from common import rotated_parser

    a = rotated_parser().parse_args(argv)
    if a.worker:
        Path(a.out).write_text(json.dumps(worker(a.worker, a.tokens)))
        sys.stdout.flush()
        os._exit(0)  # out at once, without the interpreter's teardown (bench_cpu_anchor: libgomp threads at exit)
    from bench_cpu_anchor import spread
    from common import rotated, write

    try:
        import ctranslate2  # noqa: F401

        configs = list(TIMED) + list(CT2)
    except ImportError:
        configs = list(TIMED)
    if a.only:
        configs = [c for c in configs if c in a.only.split(",")]
    runs = rotated(configs, a.reps, run_one, a.tokens)
    agree = run_one("agreement", a.tokens)
    print(f"agreement: {agree}", flush=True)
    results = {}
    fp32_answers = next((r["answers"] for r in runs.get("engine-fp32-1", []) if "answers" in r), None)
    for c, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        keys = ("tokens_per_s", "decode_tokens_per_s", "share_of_limit_in_process", "share_of_limit_paired", "process_s")
        entry = {k: spread([r[k] for r in ok]) for k in keys if ok and k in ok[0]}
        if ok and "answers" in ok[0]:
            ans = ok[0]["answers"]
            entry["answers_same_every_repeat"] = all(r["answers"] == ans for r in ok)
            if fp32_answers and len(ans) == len(fp32_answers):
                entry["answers_equal_fp32_engine"] = f"{sum(x == y for x, y in zip(ans, fp32_answers))}/{len(ans)}"
        if len(ok) < len(rs):
            entry["errors"] = [r["error"] for r in rs if "error" in r]
        results[c] = entry
    write("int8", {"tokens": a.tokens, "reps": a.reps, "summary": summarise(results, agree), "agreement": agree, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
