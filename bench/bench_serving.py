"""Serving many visitors at once, measured: N concurrent greedy requests of mixed lengths, arriving together
or staggered, served four ways, interleaved, repeated:

  (a) threads: one generation loop per visitor (pipeline.generate, transformers' dynamic cache), as each
      Streamlit session ran its own before the engine;
  (b) engine: our shared engine (pipeline.engine: continuous batching, paged KV, prefix cache); engine-unparked:
      the same engine with parking off (decode tokens and long prompts' chunks stopping at a layer for a
      newcomer), engine-nocache: with the prefix cache off (every prompt's template computed again),
      engine-mixed: without prefill first (the decode rows join the pass that prefills a newcomer): the A/Bs
      of those features. Every engine has served one chat prompt before the measures (a server's steady state);
  (c) hf-continuous: transformers' own continuous batching, `model.generate_batch` (all submitted at once);
  (d) hf-static: one left-padded `model.generate` batch (everyone waits for the batch; no late arrivals).

Aggregate tokens/s, TTFT and inter-token latency p50/p95 (where the method streams tokens), and each policy's
ratio to one request alone on the same path, medians over the repeats with their spread. The inter-token latency is
what a visitor sees: where the engine takes several decode steps a pass (EngineConfig.decode_steps, when nobody
waits), tokens arrive in bursts, so its p50 falls toward 0 and its p95 toward a pass's time (results until
2026-12-04 were measured with a token a pass; --decode-steps 1 measures that way again).

    .venv/bin/python bench/bench_serving.py [--ns 1,4,8,16,32] [--tokens 32] [--reps 2] [--threads-max 8]
"""

import argparse
import statistics
import threading
import time

from common import write

from pipeline.engine import BLOCK_SIZE
from pipeline.lab.scene import VISITOR_PROMPTS as PROMPTS


def pct(xs, q):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    return xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


WORKLOADS = {"same": (False, False), "mixed": (False, True), "staggered": (True, True), "steady": None, "long-prompt": None}
WORKLOAD_NAMES = {
    "same": "same time, same length",
    "mixed": "same time, mixed lengths",
    "staggered": "staggered, mixed lengths",
    "steady": "short questions (probes) arriving while N-1 others decode",
    "long-prompt": "probes arriving while a 1,024-token prompt is prefilled and N-2 others decode",
}
PROBES = 4  # probe requests per run in "steady" and "long-prompt": their TTFT is compared with a probe alone


def workload(lm, n, tokens, staggered, mixed):
    """n requests: prompt ids, new tokens (mixed: 1/2x, 1x, 3/2x the base), arrival offset (s), is a probe."""
    from pipeline.generation import prepare

    out = []
    for i in range(n):
        k = max(4, [tokens // 2, tokens, tokens * 3 // 2][i % 3]) if mixed else tokens
        ids = prepare(lm, PROMPTS[i % len(PROMPTS)], k, chat=True).prompt_ids
        out.append((ids, k, 0.15 * i if staggered else 0.0, False))
    return out


def probe_workload(lm, n, tokens, long_prompt):
    """n-1 requests (n-2 and a 1,024-token prompt with long_prompt) decoding, and PROBES short questions of 4
    new tokens arriving one by one once they are under way (n = 1: the probes alone, the reference)."""
    from pipeline.common.timing import ids_of_length
    from pipeline.generation import prepare

    t0 = 0.5 + 0.1 * (n - 1)  # the background's prompts are in the cache by then
    out = [(prepare(lm, PROMPTS[i % len(PROMPTS)], 3 * tokens, chat=True).prompt_ids, 3 * tokens, 0.0, False) for i in range(n - 1 - (long_prompt and n > 1))]
    if long_prompt and n > 1:
        out.append((ids_of_length(lm, 1024)[0].tolist(), tokens, t0 - 0.1, False))
    for j in range(PROBES):
        out.append((prepare(lm, PROMPTS[j % len(PROMPTS)], 4, chat=True).prompt_ids, 4, t0 + 0.6 * j, True))
    return out


def run_clients(work, serve):
    """Start one thread per request at its arrival time; serve(ids, k, t_arrival) yields token timestamps."""
    stamps = [None] * len(work)
    t0 = time.perf_counter() + 0.05

    def client(i, ids, k, at, probe):
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        arrived = time.perf_counter()
        stamps[i] = (arrived, list(serve(ids, k, arrived)), probe)

    threads = [threading.Thread(target=client, args=(i, *w)) for i, w in enumerate(work)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return stamps


def summarise(stamps, wall):
    toks = sum(len(s[1]) for s in stamps)
    ttft = [s[1][0] - s[0] for s in stamps if s[1]]
    itl = [b - a for s in stamps for a, b in zip(s[1], s[1][1:])]
    out = {
        "tokens": toks,
        "wall_s": wall,
        "tokens_per_s": toks / wall,
        "ttft_p50_s": pct(ttft, 50),
        "ttft_p95_s": pct(ttft, 95),
        "itl_p50_s": pct(itl, 50),
        "itl_p95_s": pct(itl, 95),
        "itl_max_s": max(itl) if itl else None,  # the longest pause in any answer (prefill first makes it longer)
    }
    probes = [s[1][0] - s[0] for s in stamps if s[2] and s[1]]
    if probes:
        out.update(probe_ttft_p50_s=pct(probes, 50), probe_ttft_p95_s=pct(probes, 95))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ns", default="1,4,8,16,32")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads-max", type=int, default=8, help="(a) above this N takes minutes: skipped")
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    ap.add_argument("--methods", default="threads,engine,hf-continuous,hf-static")
    ap.add_argument("--prefill-chunk", type=int, default=None, help="the engine's prompt tokens per iteration (default: the engine's)")
    ap.add_argument("--request-chunk", type=int, default=None, help="the engine's prompt tokens per request per iteration (default: the engine's)")
    ap.add_argument("--block-size", type=int, default=BLOCK_SIZE, help="the engine's KV block size in tokens (what the prefix cache shares)")
    ap.add_argument("--out", default="serving", help="results file name under bench/results/")
    ap.add_argument(
        "--decode-steps", type=int, default=None, help="the engine's greedy decode steps a pass at most (default: the engine's, 8; 1: a token a pass)"
    )
    args = ap.parse_args()
    import torch

    import pipeline
    from pipeline.engine import Engine
    from pipeline.generation import Prepared, generate

    lm = pipeline.load_model()
    methods = args.methods.split(",")
    engines = {
        m: Engine(
            lm,
            max_batch=64,
            max_queue=256,
            prefill_chunk=args.prefill_chunk,
            request_chunk=args.request_chunk,
            block_size=args.block_size,
            park=m != "engine-unparked",
            prefix_cache=m != "engine-nocache",
            **({"max_decode_stall": 0} if m == "engine-mixed" else {}),
            decode_steps=args.decode_steps,
        )
        for m in methods
        if m.startswith("engine")
    }
    from pipeline.generation import prepare

    def steady_state(eng):
        """A server's steady state before each run: it has served a chat prompt (its system turn is cached where
        the prefix cache is on) and nothing of this workload (no prompt of an earlier repeat is cached)."""
        with eng.scheduler.lock:
            eng.scheduler.pool.forget_cached()
        list(eng.submit(prepare(lm, "Hello!", 1, chat=True).prompt_ids, 1))

    def threads_serve(ids, k, arrived):
        for _ in generate(lm, "", k, cache="dynamic", request=Prepared(ids, k, []), stop_ids=set()):
            yield time.perf_counter()

    def engine_serve(eng):
        def serve(ids, k, arrived):
            for _ in eng.submit(ids, k, stop_ids=frozenset(), arrived=arrived):
                yield time.perf_counter()

        return serve

    def hf_continuous(work):
        from transformers import GenerationConfig

        gc = GenerationConfig(max_new_tokens=max(w[1] for w in work), do_sample=False, eos_token_id=-1, pad_token_id=lm.tokenizer.pad_token_id or 0)
        t = time.perf_counter()
        with lm.lock:  # no inference_mode: its worker thread updates the paged cache in place, outside that mode
            impl = lm.model.config._attn_implementation
            lm.model.set_attn_implementation("sdpa")
            try:
                out = lm.model.generate_batch(inputs=[w[0] for w in work], generation_config=gc, progress_bar=False)
            finally:
                lm.model.set_attn_implementation(impl)
        wall = time.perf_counter() - t
        errors = [r.error for r in out.values() if r.error]
        if errors:
            raise RuntimeError(errors[0])
        toks = sum(len(r.generated_tokens) for r in out.values())
        return {"tokens": toks, "wall_s": wall, "tokens_per_s": toks / wall}

    def hf_static(work):
        n = max(w[1] for w in work)
        L = max(len(w[0]) for w in work)
        pad = lm.tokenizer.pad_token_id if lm.tokenizer.pad_token_id is not None else 0
        ids = torch.tensor([[pad] * (L - len(w[0])) + w[0] for w in work])
        mask = torch.tensor([[0] * (L - len(w[0])) + [1] * len(w[0]) for w in work])
        t = time.perf_counter()
        with lm.lock, torch.inference_mode():
            impl = lm.model.config._attn_implementation
            lm.model.set_attn_implementation("sdpa")
            try:
                lm.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=pad)
            finally:
                lm.model.set_attn_implementation(impl)
        wall = time.perf_counter() - t
        useful = sum(w[1] for w in work)  # the padded rows' extra tokens are not served
        return {"tokens": useful, "wall_s": wall, "tokens_per_s": useful / wall, "rows_computed": len(work) * n}

    results = {}
    for mode in args.workloads.split(","):
        results[mode] = {"workload": WORKLOAD_NAMES[mode]}
        probing = WORKLOADS[mode] is None
        staggered = probing or WORKLOADS[mode][0]
        for n in [int(x) for x in args.ns.split(",")]:
            work = probe_workload(lm, n, args.tokens, mode == "long-prompt") if probing else workload(lm, n, args.tokens, *WORKLOADS[mode])
            runs = {m: [] for m in methods}
            for _ in range(args.reps):
                for m in methods:  # interleaved: every method once per repeat
                    if m == "threads" and n > args.threads_max:
                        continue
                    if m in ("hf-continuous", "hf-static") and staggered:
                        continue  # they take the whole batch at once
                    t = time.perf_counter()
                    if m == "threads":
                        st = run_clients(work, threads_serve)
                        runs[m].append(summarise(st, time.perf_counter() - t))
                    elif m in engines:
                        steady_state(engines[m])
                        t = time.perf_counter()
                        st = run_clients(work, engine_serve(engines[m]))
                        runs[m].append(summarise(st, time.perf_counter() - t))
                    elif m == "hf-continuous":
                        try:
                            runs[m].append(hf_continuous(work))
                        except Exception as e:  # noqa: BLE001 - record why, keep measuring
                            runs[m].append({"error": f"{type(e).__name__}: {str(e)[:200]}"})
                    else:
                        runs[m].append(hf_static(work))
            row = {}
            for m, rs in runs.items():
                ok = [r for r in rs if "tokens_per_s" in r]
                if not ok:
                    if rs:
                        row[m] = rs[-1]
                    continue
                med = {
                    k: statistics.median(r[k] for r in ok if r.get(k) is not None)
                    for k in ok[0]
                    if isinstance(ok[0][k], float) and all(r.get(k) is not None for r in ok)
                }
                med["runs_tokens_per_s"] = [round(r["tokens_per_s"], 2) for r in ok]
                row[m] = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in med.items()}
            results[mode][str(n)] = row
            print(mode, n, {m: r.get("tokens_per_s") for m, r in row.items()}, flush=True)
    alone = next(iter(results.values())).get("1", {})
    base = {m: r.get("tokens_per_s") for m, r in alone.items()}
    for mode in results.values():
        for row in mode.values():
            if not isinstance(row, dict):
                continue  # the workload's name
            for m, r in row.items():
                ref = base.get("threads") or base.get(m)
                if ref and r.get("tokens_per_s"):
                    r["ratio_vs_one_request_alone"] = round(r["tokens_per_s"] / ref, 2)
                key = "probe_ttft_p95_s" if "probe_ttft_p95_s" in r else "ttft_p95_s"
                alone_ttft = mode.get("1", {}).get(m, {}).get(key)
                if alone_ttft and r.get(key):  # the goal: <= 2x under load
                    r["ttft_p95_vs_alone"] = round(r[key] / alone_ttft, 2)
    write(
        args.out,
        {
            "model": lm.label,
            "device": lm.device_label,
            "tokens": args.tokens,
            "reps": args.reps,
            "one_request_alone_tokens_per_s": base.get("threads"),
            **(
                {
                    "engine_block_size": eng.kv.block_size,
                    "engine_prefill_chunk": eng.scheduler.prefill_chunk,
                    "engine_request_chunk": eng.scheduler.request_chunk,
                    "engine_decode_steps": eng.config.decode_steps,
                }
                if (eng := next(iter(engines.values()), None))
                else {}
            ),
            "prefix_cache": {m: {k: getattr(e.stats(), k) for k in ("prefix_hit_requests", "prefix_hit_tokens", "blocks_cached")} for m, e in engines.items()},
            "results": results,
        },
    )


if __name__ == "__main__":
    main()
