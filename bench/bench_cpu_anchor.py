"""Our CPU inference held against the hardware and a dedicated engine, in one run.

    .venv/bin/python bench/bench_cpu_anchor.py [--reps 3] [--tokens 32]      -> bench/results/cpu_anchor.json

What it measures, each configuration in its own fresh process, the configurations in a rotated order every
repeat (interleaved: a slow minute on a shared machine hits every configuration, not one), medians with min-max:

  * row-step-split  one row step's time: as it runs (a layer per C call), with a call per operation, and that
                 without its matrix products (pipeline.decode_step.cpu.row_step's docstring);
  * probe        the machine's read bandwidth: a buffer as large as the model's weights (the bytes a decode step
                 must read) read by pipeline/decode_step/cpu/cpu_decode.c's read_sum (AVX2, both threads, four streams each),
                 best of 15; the limit is bandwidth / weight bytes = tokens/s one request cannot beat in fp32 (torch
                 summing every weight tensor, the first probe, is reported beside it: it read 12-22 GB/s where this
                 read 31-54 as one stream a thread, and reads more as four). The single-request configurations
                 also take this probe in their own process, 3 reads before each request (ReadClock): their share
                 of the limit at the same minutes (against the run's fastest read, and paired: each request against
                 the reads just before it, the median over requests);
  * ours-dynamic / ours-static / ours-fused
                 our own single-request loop (pipeline.generate) in each cache mode: decode tokens/s (first
                 token to last, prefill excluded) over the 8 prompts one after another;
  * engine-1 / engine-8 / engine-32
                 the shared engine (pipeline.engine, its defaults: passes of up to 8 greedy decode steps where
                 nobody waits, EngineConfig.decode_steps; engine-1-onestep: a pass a token, for contrast in the
                 same run) with 1 request at a time, 8 and 32 at once: generated
                 tokens / wall time from the first submit to the last token (prefill included, as for
                 CTranslate2's batch below); engine-1 also reports decode tokens/s like ours-*. For the comparison
                 with CTranslate2 the batches run with the prefix cache OFF (it prefills every prompt, so do we)
                 and warm up on prompts outside the measured set (WARM); engine-8-prefix / engine-32-prefix: the
                 same with the prefix cache on (the chat template's system turn is shared), labelled as such;
  * ct2-float32-1/8/32, ct2-int8-1/8
                 CTranslate2 (a bench-only dependency: `pip install ctranslate2`; skipped when absent) on the
                 same weights converted from our cached safetensors: alone (decode tokens/s, by its token
                 stream) and static batches (generated tokens / wall time);
  * *-fallback   the engine without pipeline/decode_step/cpu/cpu_decode.c (LLM_EXPLORER_PANEL=0: OpenBLAS for one row, oneDNN
                 for several, numpy/torch attention; what a machine without a C compiler or AVX2 runs);
  * *-loaded     engine-1 (native and fallback) and ct2-float32-1 again while a second process keeps both cores
                 busy (two threads of matrix products): what a busy server leaves of one visitor's decode speed;
                 -noplan: the fallback without pipeline.decode_step.cpu.threads' plan (every step on both threads,
                 LLM_EXPLORER_THREAD_PLAN=0; the native kernels run without it); the first 2 prompts only;
  * hf-generate  transformers' model.generate, greedy: the tokens every configuration is checked against.

The prompts: 8 chat prompts "Name N colours and one thing of each colour." (N = 2..9; 32 more, N = 2..33, for the
batch of 32), 32 greedy tokens each, end-of-sequence off. Greedy agreement: how many of the answers equal
transformers' generate token for token (and equal our dynamic loop's).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

PROMPT = "Name {n} colours and one thing of each colour."
WARM = "Describe {n} animals in one line each."  # warm-ups: never one of the measured prompts
TIMED = (
    "probe",
    "row-step-split",
    "ours-dynamic",
    "ours-static",
    "ours-fused",
    "engine-1",
    "engine-1-onestep",
    "engine-8",
    "engine-32",
    "engine-8-prefix",
    "engine-32-prefix",
    "engine-1-fallback",
    "engine-8-fallback",
)
CT2 = ("ct2-float32-1", "ct2-float32-8", "ct2-float32-32", "ct2-int8-1", "ct2-int8-8")
LOADED = ("engine-1-loaded", "engine-1-fallback-loaded", "engine-1-fallback-loaded-noplan", "ct2-float32-1-loaded")
SUFFIXES = ("-noplan", "-loaded", "-fallback", "-prefix", "-onestep")


def base_of(config: str) -> str:
    for suffix in SUFFIXES:
        config = config.replace(suffix, "")
    return config


def prompts(lm, n: int, tokens: int, text: str = PROMPT) -> list[list[int]]:
    from pipeline import generation

    return [generation.prepare(lm, text.format(n=k), tokens, chat=True).prompt_ids for k in range(2, 2 + n)]


# ------------------------------------------------------------------------------------------------ workers
def read_once(lm) -> float:
    """Seconds for torch to sum every weight tensor once (the first probe, kept for contrast: its many small
    reductions measure torch's sum, not the memory)."""
    t = time.perf_counter()
    for w in lm.model.parameters():
        w.detach().sum()
    return time.perf_counter() - t


def weight_bytes(lm) -> int:
    return sum(w.numel() * w.element_size() for w in lm.model.parameters())


def probe(lm) -> dict:
    """The memory's read speed: a buffer as large as the weights read by pipeline/decode_step/cpu/cpu_decode.c's read_sum (AVX2,
    the process's threads), best of 15; the limit is one such read per token. The torch-sum probe beside it."""
    import torch

    from pipeline.decode_step.cpu.bandwidth import Reader

    nbytes = weight_bytes(lm)
    reader = Reader(nbytes)
    best = min(reader.once() for _ in range(15))
    read_once(lm)  # warm
    torch_s = statistics.median(read_once(lm) for _ in range(7))
    return {
        "weight_bytes": nbytes,
        "gb_per_s": nbytes / best / 1e9,
        "limit_tokens_per_s": 1 / best,
        "kernel": reader.kernel,
        "torch_sum_gb_per_s": nbytes / torch_s / 1e9,
        "threads": torch.get_num_threads(),
    }


class ReadClock:
    """The read probe taken in the same process, between the requests being measured (3 reads of a buffer as large
    as the weights before each, pipeline.decode_step.cpu.bandwidth.Reader): the limit at the same minutes as the decode it is
    compared with, the fastest of those reads (the memory did that much). On a shared machine the read speed moves
    between minutes, so a limit measured in another process at another time is ~±15% off."""

    def __init__(self, lm):
        from pipeline.decode_step.cpu.bandwidth import Reader

        self.reader, self.times, self.pairs = Reader(weight_bytes(lm)), [], []

    def tick(self) -> None:
        self.times += [self.reader.once() for _ in range(3)]

    def request(self, tokens: int, seconds: float) -> None:
        """A request's decode, measured right after the last tick: paired with that tick's fastest read."""
        self.pairs.append((tokens / seconds, 1 / min(self.times[-3:])))

    def limit(self) -> float:
        return 1 / min(self.times)

    def paired(self) -> float:
        """The median over requests of (its decode rate / the limit read just before it): the same minutes, request
        by request, where limit() takes the run's fastest read for every request."""
        return statistics.median(rate / limit for rate, limit in self.pairs)

    def shares(self, rate: float) -> dict:
        limit = self.limit()
        return {"limit_in_process_tokens_per_s": limit, "share_of_limit_in_process": rate / limit, "share_of_limit_paired": self.paired()}


def ours(lm, mode: str, ps, tokens: int, steps: int | None = None) -> dict:
    """One request at a time: our own loop in a cache mode, or (mode "engine") the shared engine (`steps`: its
    decode_steps, None: its default)."""
    from pipeline import generation
    from pipeline.engine import Engine
    from pipeline.generation.events import StepEvent

    eng = Engine(lm, decode_steps=steps) if mode == "engine" else None
    clock = ReadClock(lm)
    answers, decode_s, decode_n, wall_s = [], 0.0, 0, 0.0
    for i, ids in enumerate([ps[0]] + ps):  # the first one again as a warm-up, not counted
        if i:
            clock.tick()
        t0 = time.perf_counter()
        if eng is not None:
            events = eng.submit(ids, tokens, stop_ids=set())
        else:
            events = generation.generate(lm, "", request=generation.Prepared(ids, tokens, []), cache=mode, stop_ids=set())
        toks, ts = [], []
        for ev in events:
            if isinstance(ev, StepEvent):
                toks.append(ev.token_id)
                ts.append(time.perf_counter())
        if i:
            answers.append(toks)
            decode_s += ts[-1] - ts[0]
            decode_n += len(ts) - 1
            wall_s += ts[-1] - t0
            clock.request(len(ts) - 1, ts[-1] - ts[0])
    rate = decode_n / decode_s
    out = {"decode_tokens_per_s": rate, "tokens_per_s": sum(map(len, answers)) / wall_s, **clock.shares(rate), "answers": answers}
    return out | ({"decode_steps": eng.config.decode_steps} if eng is not None else {})


def engine_batch(lm, ps, tokens: int, prefix_cache: bool) -> dict:
    from pipeline.engine import Engine
    from pipeline.generation.events import StepEvent

    eng = Engine(lm, prefix_cache=prefix_cache)
    for h in [eng.submit(p, 4, stop_ids=set()) for p in prompts(lm, 2, 4, WARM)]:  # warm-up, outside the measured set
        list(h)
    t = time.perf_counter()
    hs = [eng.submit(p, tokens, stop_ids=set()) for p in ps]
    answers = [[e.token_id for e in h if isinstance(e, StepEvent)] for h in hs]
    s = time.perf_counter() - t
    return {"tokens_per_s": sum(map(len, answers)) / s, "answers": answers}


def ct2_model(lm, kind: str) -> Path:
    """Our cached SmolLM2 (its safetensors folder) converted once for CTranslate2 (float32 or int8)."""
    import ctranslate2.converters as conv

    from pipeline.model import cache_dir

    src = Path(lm.source)
    out = cache_dir() / "bench-ct2" / f"{src.name}-{kind}"
    if not (out / "model.bin").exists():
        tmp = out.with_name(out.name + f".tmp-{os.getpid()}")
        conv.TransformersConverter(str(src)).convert(str(tmp), quantization=kind, force=True)
        tmp.rename(out)
    return out


def ct2(lm, kind: str, n: int, ps, tokens: int) -> dict:
    import ctranslate2

    gen = ctranslate2.Generator(str(ct2_model(lm, kind)), device="cpu", compute_type=kind, intra_threads=os.cpu_count() or 2)
    tok = lm.tokenizer
    pieces = [tok.convert_ids_to_tokens(p) for p in ps]
    kw = {"max_length": tokens, "sampling_topk": 1, "end_token": []}
    warm = [tok.convert_ids_to_tokens(p) for p in prompts(lm, 2, 4, WARM)]
    gen.generate_batch(warm, max_length=4, sampling_topk=1, end_token=[])  # warm-up, outside the measured set
    if n == 1:
        answers, decode_s, decode_n = [], 0.0, 0
        clock = ReadClock(lm)
        for p in pieces:
            clock.tick()
            toks, ts = [], []
            for step in gen.generate_tokens(p, **kw):
                toks.append(step.token_id)
                ts.append(time.perf_counter())
            answers.append(toks)
            decode_s += ts[-1] - ts[0]
            decode_n += len(ts) - 1
            clock.request(len(ts) - 1, ts[-1] - ts[0])
        rate = decode_n / decode_s
        return {"decode_tokens_per_s": rate, **clock.shares(rate), "answers": answers}
    t = time.perf_counter()
    res = gen.generate_batch(pieces, include_prompt_in_result=False, **kw)
    s = time.perf_counter() - t
    answers = [r.sequences_ids[0] for r in res]
    return {"tokens_per_s": sum(map(len, answers)) / s, "answers": answers}


def hf_generate(lm, ps, tokens: int) -> dict:
    import torch
    from transformers import GenerationConfig

    # end-of-sequence OFF as every configuration runs it: generated like any token, not forbidden. min_new_tokens
    # forbids it instead, and 4 of the 32 answers (N = 11, 15, 32, 33) then "differed" at the step where the model's
    # top token was <|im_end|> (ours and CTranslate2's alike). An id past the vocabulary ends nothing.
    gc = GenerationConfig(max_new_tokens=tokens, do_sample=False, eos_token_id=lm.model.config.vocab_size, pad_token_id=0)
    out = []
    with torch.inference_mode():
        for p in ps:
            ids = torch.tensor([p])
            g = lm.model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=gc)
            out.append(g[0, len(p) :].tolist())
    return {"answers": out}


def split(lm) -> dict:
    """Where one row step's time goes, three ways interleaved (30 each, positions 40-130): the step as it runs (each
    layer one C call, where it applies), the step with a Python call per operation (pipeline.decode_step.cpu.row_step's
    WHOLE_LAYERS off), and that step with its matrix products replaced by returning zeros: products = the difference
    of the last two, the rest = the last."""
    import numpy as np

    from pipeline.decode_step import fused
    from pipeline.decode_step.cpu import row_kv, row_step

    st = row_step.row_step(fused.fused_model(lm))
    dec = fused.acquire_decoder(fused.fused_model(lm), 160)
    kv = row_kv.BufferKV(dec.K, dec.V)
    real = row_step._RowLayer.project
    zeros: dict = {}

    def stub(self, name, x):
        n = self.n[name][0].shape[0]
        return zeros.setdefault((name, x.shape[0], n), np.zeros((x.shape[0], n), dtype=np.float32))

    ways = ("one call a layer", "a call per operation", "without the products")
    times: dict[str, list[float]] = {w: [] for w in ways}
    try:
        with lm.lock:
            for p in range(130):
                kv.pos = p
                which = ways[p % 3]
                row_step.WHOLE_LAYERS = which == ways[0]
                row_step._RowLayer.project = stub if which == ways[2] else real
                t = time.perf_counter()
                st.logits([5], [p], kv)
                if p >= 40:
                    times[which].append((time.perf_counter() - t) * 1000)
    finally:
        row_step._RowLayer.project = real
        row_step.WHOLE_LAYERS = True
        dec.release()
    whole, calls, rest = (statistics.median(times[w]) for w in ways)
    return {"step_ms": whole, "step_per_operation_ms": calls, "rest_ms": rest, "products_ms": calls - rest}


def burner(stop_file: str) -> None:
    """A second process keeping both cores busy: two threads multiplying matrices until the file disappears."""
    import threading

    os.environ["OPENBLAS_NUM_THREADS"] = "1"  # before numpy loads OpenBLAS: one busy thread per core, no more
    import numpy as np

    def spin():
        a = np.random.rand(300, 300).astype(np.float32)
        while os.path.exists(stop_file):
            a @ a

    ts = [threading.Thread(target=spin) for _ in range(os.cpu_count() or 2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def worker(config: str, tokens: int) -> dict:
    import pipeline

    lm = pipeline.load_model()
    base = base_of(config)
    n = 32 if base.endswith("-32") or base == "hf-generate" else 2 if "-loaded" in config else 8  # under load: 2 prompts (~2 tok/s)
    ps = prompts(lm, n, tokens)
    if base == "probe":
        return probe(lm)
    if base == "row-step-split":
        return split(lm)
    if base.startswith("ours-"):
        return ours(lm, base.removeprefix("ours-"), ps, tokens)
    if base == "engine-1":
        return ours(lm, "engine", ps, tokens, steps=1 if "-onestep" in config else None)
    if base.startswith("engine-"):
        return engine_batch(lm, ps, tokens, prefix_cache=config.endswith("-prefix"))
    if base.startswith("ct2-"):
        _, kind, k = base.split("-")
        return ct2(lm, kind, int(k), ps, tokens)
    if base == "hf-generate":
        return hf_generate(lm, ps, tokens)
    raise SystemExit(f"unknown configuration {config}")


# ------------------------------------------------------------------------------------------------ driver
def run_one(config: str, tokens: int) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "out.json"
        stop = Path(d) / "burn"
        burn = None
        if "-loaded" in config:
            stop.write_text("1")
            burn = subprocess.Popen([sys.executable, __file__, "--burner", str(stop)])
            time.sleep(1.0)
        try:
            t = time.perf_counter()
            env = dict(os.environ)
            if "-noplan" in config:
                env["LLM_EXPLORER_THREAD_PLAN"] = "0"
            if "-fallback" in config:
                env["LLM_EXPLORER_PANEL"] = "0"
            r = subprocess.run(
                [sys.executable, __file__, "--worker", config, "--tokens", str(tokens), "--out", str(out)], capture_output=True, text=True, env=env
            )
            if r.returncode and not out.exists():
                return {"error": (r.stderr or r.stdout)[-800:]}
            res = json.loads(out.read_text())
            if r.returncode:  # the figures were written; the process failed on its way out (said, not hidden)
                res["exit"] = f"{r.returncode}: {(r.stderr or '').strip()[-200:]}"
            res["process_s"] = time.perf_counter() - t
            return res
        finally:
            if burn is not None:
                stop.unlink(missing_ok=True)
                burn.wait(30)


def spread(xs: list[float]) -> dict:
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "runs": xs} if xs else {}


def main(argv=None) -> int:
    from common import rotated_parser

    ap = rotated_parser()
    ap.add_argument("--burner", help="(internal) keep both cores busy (the *-loaded configurations)")
    a = ap.parse_args(argv)
    if a.burner:
        burner(a.burner)
        return 0
    if a.worker:
        Path(a.out).write_text(json.dumps(worker(a.worker, a.tokens)))
        # out at once, without the interpreter's teardown: a thread still inside libgomp (the engine's worker, the
        # burner's products) while Python finalises aborted 7 of 21 workers with "terminate called without an
        # active exception" after their figures were written
        sys.stdout.flush()
        os._exit(0)
    from common import rotated, write

    try:
        import ctranslate2  # noqa: F401

        have_ct2 = True
    except ImportError:
        have_ct2 = False
    configs = list(TIMED) + (list(CT2) if have_ct2 else []) + [c for c in LOADED if have_ct2 or not c.startswith("ct2")]
    if a.only:
        configs = [c for c in configs if c in a.only.split(",")]
    reference = run_one("hf-generate", a.tokens)
    runs = rotated(configs, a.reps, run_one, a.tokens)
    ref = reference.get("answers")
    results = {}
    for c, rs in runs.items():
        ok = [r for r in rs if "error" not in r]
        keys = (
            "tokens_per_s",
            "decode_tokens_per_s",
            "gb_per_s",
            "torch_sum_gb_per_s",
            "limit_tokens_per_s",
            "limit_in_process_tokens_per_s",
            "share_of_limit_in_process",
            "share_of_limit_paired",
            "step_ms",
            "step_per_operation_ms",
            "products_ms",
            "rest_ms",
        )
        entry = {k: spread([r[k] for r in ok]) for k in keys if ok and k in ok[0]}
        if ok and "decode_steps" in ok[0]:
            entry["decode_steps"] = ok[0]["decode_steps"]  # the engine's greedy decode steps a pass at most
        if ok and "answers" in ok[0]:
            ans = ok[0]["answers"]
            if ref:  # the reference answers all 32 prompts; the 8 are its first 8: every answer is checked
                entry["answers_equal_transformers_generate"] = f"{sum(x == y for x, y in zip(ans, ref))}/{len(ans)}"
            dyn = runs.get("ours-dynamic", [{}])[0].get("answers")
            if dyn and len(ans) == len(dyn):
                entry["answers_equal_our_loop"] = f"{sum(x == y for x, y in zip(ans, dyn))}/{len(ans)}"
            entry["answers_same_every_repeat"] = all(r["answers"] == ans for r in ok)
        if len(ok) < len(rs):
            entry["errors"] = [r["error"] for r in rs if "error" in r]
        results[c] = entry
    summary = summarise(results)
    write("cpu_anchor", {"prompt": PROMPT, "tokens": a.tokens, "reps": a.reps, "summary": summary, "results": results})
    return 0


def summarise(results: dict) -> dict:
    def med(c, k):
        return results.get(c, {}).get(k, {}).get("median")

    limit = med("probe", "limit_tokens_per_s")
    one = med("engine-1", "decode_tokens_per_s")
    one_wall = med("engine-1", "tokens_per_s")
    out = {
        "read_bandwidth_gb_per_s": med("probe", "gb_per_s"),  # the C read probe (pipeline.decode_step.cpu.bandwidth)
        "torch_sum_read_gb_per_s": med("probe", "torch_sum_gb_per_s"),  # the first probe, for contrast
        "limit_tokens_per_s": limit,
        "ours_alone_decode_tokens_per_s": one,
        "ours_alone_share_of_limit": one / limit if one and limit else None,
        # the same ratio with the read probe taken inside the decode's own process, between its requests (ReadClock)
        "ours_alone_share_of_limit_in_process": med("engine-1", "share_of_limit_in_process"),
        "ct2_float32_alone_share_of_limit_in_process": med("ct2-float32-1", "share_of_limit_in_process"),
        # ... and request by request, each with the reads taken just before it (ReadClock.paired)
        "ours_alone_share_of_limit_paired": med("engine-1", "share_of_limit_paired"),
        "ct2_float32_alone_share_of_limit_paired": med("ct2-float32-1", "share_of_limit_paired"),
        # the engine's passes of several decode steps (EngineConfig.decode_steps) against a pass a token, same run
        "ours_alone_one_step_a_pass_decode_tokens_per_s": med("engine-1-onestep", "decode_tokens_per_s"),
        "ours_alone_one_step_a_pass_share_of_limit_paired": med("engine-1-onestep", "share_of_limit_paired"),
        "ours_fused_loop_decode_tokens_per_s": med("ours-fused", "decode_tokens_per_s"),
        "ct2_float32_alone_decode_tokens_per_s": med("ct2-float32-1", "decode_tokens_per_s"),
        # batches: our prefix cache off (CTranslate2 prefills every prompt), warm-ups outside the measured prompts
        "engine_8_tokens_per_s": med("engine-8", "tokens_per_s"),
        "ct2_float32_batch_8_tokens_per_s": med("ct2-float32-8", "tokens_per_s"),
        "engine_32_tokens_per_s": med("engine-32", "tokens_per_s"),
        "ct2_float32_batch_32_tokens_per_s": med("ct2-float32-32", "tokens_per_s"),
        # ... and with our prefix cache on (the chat template's system turn computed once): labelled apart
        "engine_8_prefix_cache_on_tokens_per_s": med("engine-8-prefix", "tokens_per_s"),
        "engine_32_prefix_cache_on_tokens_per_s": med("engine-32-prefix", "tokens_per_s"),
        "fallback_alone_decode_tokens_per_s": med("engine-1-fallback", "decode_tokens_per_s"),
        "fallback_engine_8_tokens_per_s": med("engine-8-fallback", "tokens_per_s"),
        "ours_alone_under_load_decode_tokens_per_s": med("engine-1-loaded", "decode_tokens_per_s"),
        "fallback_alone_under_load_decode_tokens_per_s": med("engine-1-fallback-loaded", "decode_tokens_per_s"),
        "fallback_alone_under_load_without_thread_plan_decode_tokens_per_s": med("engine-1-fallback-loaded-noplan", "decode_tokens_per_s"),
        "ct2_float32_alone_under_load_decode_tokens_per_s": med("ct2-float32-1-loaded", "decode_tokens_per_s"),
    }
    for n in (8, 32):
        a, b = out[f"engine_{n}_tokens_per_s"], out[f"ct2_float32_batch_{n}_tokens_per_s"]
        out[f"engine_{n}_over_ct2_batch_{n}_prefix_cache_off"] = a / b if a and b else None
    ct2_one = out["ct2_float32_alone_decode_tokens_per_s"]
    out["ours_alone_over_ct2_float32_alone_decode"] = one / ct2_one if one and ct2_one else None
    if out["ours_alone_under_load_decode_tokens_per_s"] and one:
        out["ours_under_load_share_of_quiet"] = out["ours_alone_under_load_decode_tokens_per_s"] / one
    if out["engine_8_tokens_per_s"] and one_wall:
        # both wall clock from the first submit to the last token, prefill included (what a visitor waits)
        out["engine_8_over_alone"] = out["engine_8_tokens_per_s"] / one_wall
    return out


if __name__ == "__main__":
    sys.exit(main())
