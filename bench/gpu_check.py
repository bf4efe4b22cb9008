"""One prepared script for a GPU machine (also runs on CPU, smaller): the generation issue's GPU paths.

SmolLM2-135M's architecture from bench/assets/smollm2-shape (config + tokenizer, 3.5 MB) with seeded random
weights in bf16 (the real 98 MB weights do not travel); timings and memory depend on the shape, not the values.
Measures, in this order (the JSON is rewritten after each section, so a timeout keeps what was done; a
section that fails records its error and the rest go on; the issue's figures come first):
  1. production mode: greedy tokens/s of the dynamic-cache loop, transformers' static cache, our fused step
     (a CUDA graph on CUDA) and the fused step compiled by torch.compile and then captured; same-token checks;
     the fused step alone back to back (the device floor per token, so loop minus floor = host work: the batch-1
     step, goal >= 2,000 tok/s; the plain graph is of the trimmed Triton kernels, pipeline.decode_step.gpu.triton_step, where
     they serve, and the torch step's graph is measured beside it); operators and kernels per step; graph capture and compile times; the fused step's
     logits against a plain forward;
  2. the serving sweep: N = 1 ... 256 requests at once through our engine (continuous batching, paged KV) with its
     decode passes as CUDA graphs (engine.graphed, several greedy steps a replay) and without, aggregate tokens/s,
     every answer against transformers' greedy generate; the engine's batch-1 graph alone; the share of time the GPU
     runs no kernel (torch.profiler) at 1 and 256; transformers' static batch of the same N, eager and (at 1 and
     256) with its own CUDA graphs (goals on an H200/H100: >= 1,000 tok/s at N = 1, >= 15,000 and >= 2x
     transformers' graphed static batch at N = 256; the anchor's HF static batch of 256 measured 6,506);
  3. exact: one request's logits alone, beside 7 and 31 others, and from the prefix cache, the differing values
     counted, with the decode graphs and without (issue 34: 0 on a CPU with the C kernels; on the H200 the torch
     path's count, 0 in every case measured);
  4. TTFT, TPOT, tokens/s of our loop with and without the KV cache, transformers' generate on the same model,
     greedy agreement, the telemetry timeline at batch 1 (NVML utilisation over time);
  5. the attention kernels sweep (time, peak memory, agreement);
  6. speculative decoding with prompt lookup on a copy-style prompt (random weights: speed only);
  7. the CPU decode path (pipeline.decode_step.cpu.row_step) on the machine's own processors, fp32: the C read probe's limit and
     one request's decode tokens/s (its share of the limit), the row step against transformers' loop.
Writes JSON to $OUT (device machine) or bench/results/.

    python bench/gpu_check.py [--tokens 128] [--device cuda]
"""

import argparse
import functools
import json
import os
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the lent GPU machine runs this file from a copy of the tree, not installed


def main():
    import torch

    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--lengths", default="512,1024,2048,4096,8192", help="attention-kernel prompt lengths")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile mode")
    ap.add_argument("--only", default="production,serving,exact,loop,kernels,speculative,cpu")
    ap.add_argument("--serving-ns", default="1,8,32,64,128,256")
    args = ap.parse_args()
    only = set(args.only.split(","))
    from pipeline.common.telemetry import Sampler
    from pipeline.forward.tokens import tokenize
    from pipeline.generation import generate, metrics
    from pipeline.model import random_model

    lm = random_model(ROOT / "bench" / "assets" / "smollm2-shape", device=args.device)
    prompt, n = "Why is the sky blue?", args.tokens
    ids = torch.tensor([tokenize(lm.tokenizer, prompt, chat=True).input_ids], device=lm.device)
    res = {"device": lm.device_label, "model": lm.label, "dtype": str(lm.dtype), "new_tokens": n, "prompt_tokens": ids.shape[1]}

    out_dir = Path(os.environ.get("OUT") or ROOT / "bench" / "results")
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "gpu_check.json"

    res["env"] = {
        "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
    }

    def save():
        head = headline(res)
        path.write_text(json.dumps({"env": res["env"], "headline": head, **{k: v for k, v in res.items() if k != "env"}}, indent=1, default=float))

    def section(name, fn):
        if name not in only:
            return
        t = time.perf_counter()
        try:
            fn()
        except Exception as e:  # record and go on: one failure must not lose the other figures
            import traceback

            res.setdefault("errors", {})[name] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-2000:]}"
        res.setdefault("section_seconds", {})[name] = time.perf_counter() - t
        save()
        print(f"[{name}] {res['section_seconds'][name]:.1f} s", flush=True)

    def production():
        from pipeline.decode_step import fused, fused_measures
        from pipeline.generation import compare_cache_modes

        cuda = lm.device.type == "cuda"
        modes = ("dynamic", "static", "fused") + (("fused+compile",) if cuda and not args.no_compile else ())
        out = res["production"] = {"fused_mode": fused_measures.mode_label(lm)}
        out["fused_vs_forward"] = asdict(fused_measures.check_against_forward(lm, ids[0].tolist()))
        save()
        for compile_ in (False, True) if "fused+compile" in modes else (False,):
            t = time.perf_counter()
            dec = fused.acquire_decoder(fused.fused_model(lm), ids.shape[1] + n, compile=compile_)
            dec.release()
            key = "compile" if compile_ else "plain"
            out[f"build_{key}_s"] = time.perf_counter() - t  # compile (first call) + capture
            out[f"capture_{key}_s"] = dec.capture_s
            out[f"compile_{key}_s"] = dec.compile_s
            out[f"mode_{key}"] = dec.mode
            out[f"problems_{key}"] = dec.problems
            out[f"step_floor_{key}"] = asdict(fused_measures.step_floor(lm, 200 if cuda else 10, compile=compile_))
            save()
        if cuda:  # the plain graph is of the trimmed Triton kernels where they serve: the torch step's graph beside it
            out["step_floor_torch_graph"] = asdict(fused_measures.step_floor(lm, 200, trimmed=False))
            out["trimmed_unusable"] = fused.CHOICE.trimmed_step(fused.fused_model(lm))
            save()
        out["launches_per_step"] = asdict(fused_measures.launches_per_step(lm, compile="fused+compile" in modes))
        save()
        r = compare_cache_modes(lm, prompt, n, chat=True, reps=args.reps, modes=modes)
        for m, v in r.modes.items():
            mt = metrics(v.events)
            out[m] = {
                "tokens_per_s": v.tokens_per_s,
                "tpot_ms": (mt.tpot_s or 0) * 1000,
                "ttft_ms": mt.ttft_s * 1000,
                "warmup_s": v.warmup_s,
                "runs": v.runs,
                "utilisation": v.utilisation,
                "utilisation_of": v.utilisation_of,
                "engine": v.engine,
                "same_tokens_as_dynamic": r.same_tokens(m),
                "ratio_vs_dynamic": r.ratio(m) or 0,
            }
        for key, m in (("plain", "fused"), ("compile", "fused+compile")):
            if m in out and f"step_floor_{key}" in out:  # what the loop adds per token on the host
                out[m]["host_ms_per_token"] = out[m]["tpot_ms"] - out[f"step_floor_{key}"]["step_ms"]

    def loop():
        def ours(use_cache=True, k=n):
            ev = list(generate(lm, prompt, k, chat=True, use_cache=use_cache))
            return ev

        def hf(use_cache=True, k=n):
            if lm.device.type == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            with torch.inference_mode():
                out = lm.model.generate(ids, max_new_tokens=k, min_new_tokens=k, do_sample=False, use_cache=use_cache)
            if lm.device.type == "cuda":
                torch.cuda.synchronize()
            return out[0, ids.shape[1] :].tolist(), time.perf_counter() - t

        ours(k=4), hf(k=4)  # warm up
        runs, hf_rates = [], []
        for _ in range(args.reps):
            ev = ours()
            runs.append(ev)
            toks, s = hf()
            hf_rates.append(len(toks) / s)
        m = [metrics(ev) for ev in runs]
        res["ours_cache"] = {
            "ttft_ms": statistics.median(x.ttft_s for x in m) * 1000,
            "tpot_ms": statistics.median(x.tpot_s for x in m) * 1000,
            "decode_tokens_per_s": statistics.median(x.tokens_per_s for x in m),
            "end_to_end_tokens_per_s": statistics.median(x.n / x.latency_s for x in m),
        }
        res["hf_generate_tokens_per_s"] = statistics.median(hf_rates)
        res["ratio_ours_vs_hf_end_to_end"] = res["ours_cache"]["end_to_end_tokens_per_s"] / res["hf_generate_tokens_per_s"]
        res["greedy_equal_to_hf"] = [e.token_id for e in runs[-1]] == toks[: len(runs[-1])]
        k_off = min(n, 64)
        ev_off = ours(use_cache=False, k=k_off)
        mo = metrics(ev_off)
        res["ours_no_cache"] = {
            "tokens": k_off,
            "ttft_ms": mo.ttft_s * 1000,
            "tpot_ms": (mo.tpot_s or 0) * 1000,
            "decode_tokens_per_s": mo.tokens_per_s,
            "first_step_ms": ev_off[1].step_s * 1000,
            "last_step_ms": ev_off[-1].step_s * 1000,
        }
        with Sampler(interval_s=0.02) as sampler:
            t_start = time.perf_counter()
            ev = list(generate(lm, prompt, n, chat=True))
            for e in ev:
                sampler.mark(e.phase, t_start + e.t_s - e.step_s, t_start + e.t_s)
        tl = sampler.timeline
        util = [s.get("gpu_util") for s in tl.samples if "gpu_util" in s]
        res["telemetry"] = {
            "source": tl.source,
            "samples": len(tl.samples),
            "nvml_buffered_samples": len(tl.nvml_util),
            "mean_gpu_util": statistics.mean(util) if util else None,
            "mean_nvml_buffered_util": statistics.mean(v for _, v in tl.nvml_util) if tl.nvml_util else None,
            "timeline": tl.samples[:400],
            "nvml_util": tl.nvml_util[:400],
            "marks": tl.marks[:400],
        }

    def kernels():
        from pipeline.lab.attention_kernels import kernel_sweep

        res["attention_kernels"] = [asdict(r) for r in kernel_sweep(lm, [int(x) for x in args.lengths.split(",")])]

    def speculative():
        from pipeline.generation.speculative import speculative_generate

        copy = "Rewrite this code with better names:\ndef f(a, b):\n    c = a + b\n    return c\n" * 4
        t = time.perf_counter()
        plain = [e.token_id for e in generate(lm, copy, n, chat=True)]
        plain_s = time.perf_counter() - t
        sp = speculative_generate(lm, copy, "prompt_lookup", gamma=4, max_new_tokens=n, chat=True)
        res["speculative_prompt_lookup"] = {
            "speedup": plain_s / sp.seconds,
            "acceptance_rate": sp.acceptance_rate,
            "tokens_per_target_call": len(sp.tokens) / sp.target_calls,
            "identical_to_plain": sp.tokens == plain,
        }

    def serving():
        """The engine at N = 1 ... 256 requests with its decode graphs and without (the same engine settings, the prefix
        cache off: every repeat prefills its N prompts, as transformers' static batch does), every answer checked
        against transformers' greedy generate of the prompt alone; the engine's batch-1 graph replay back to back
        (its device floor a token); the share of wall time the GPU has no kernel running (torch.profiler) at 1 and
        at the largest N; transformers' static batch of the same N, eager and with its own CUDA graphs
        (cache_implementation="static", its forward compiled with torch.compile's "reduce-overhead")."""
        from transformers import CompileConfig

        from pipeline.engine import Engine

        ids1 = ids[0].tolist()
        ns = [int(x) for x in args.serving_ns.split(",")]
        with torch.inference_mode():
            ref = lm.model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False)[0, ids.shape[1] :].tolist()
        out = res.setdefault("serving", {})
        for graphs in (True, False):
            eng = Engine(lm, max_batch=512, max_queue=1024, prefix_cache=False, graphs=graphs, kv_pool_bytes=4 << 30)
            key = "graphs" if graphs else "no_graphs"
            out[f"engine_{key}"] = eng.name
            for N in ns:
                row = out.setdefault(str(N), {"requests": N})
                rates = []
                for rep in range(3):  # the first run warms kernels, RoPE tables and captures the graphs
                    t = time.perf_counter()
                    answers = at_once(eng, N)
                    wall = time.perf_counter() - t
                    if rep:
                        rates.append(sum(map(len, answers)) / wall)
                row[f"{key}_tokens_per_s"] = statistics.median(rates)
                row[f"{key}_runs"] = rates
                row[f"{key}_answers_equal_generate"] = sum(a == ref for a in answers)
                if N in (1, max(ns)) and lm.device.type == "cuda":
                    row[f"{key}_gpu_idle_share"] = gpu_idle_share(functools.partial(at_once, eng, N))
                save()
                print(
                    f"serving N={N} {key}: engine {row[f'{key}_tokens_per_s']:.0f} tok/s, {row[f'{key}_answers_equal_generate']}/{N} answers = generate",
                    flush=True,
                )
            if graphs:
                out["graphs_report"] = eng.step.graphs.report()
                out["graph_step_alone"] = graph_step_alone(eng)
            out[f"iterations_{key}"] = eng.iterations
            del eng  # its pool and graphs freed before the next engine
            free_device()
        for N in ns:
            row = out[str(N)]
            batch = torch.tensor([ids1] * N, device=lm.device)
            row["hf_static_tokens_per_s"] = hf_rate(batch)
            if lm.device.type == "cuda" and N in (1, max(ns)) and not args.no_compile:
                try:
                    row["hf_static_graphs_tokens_per_s"] = hf_rate(batch, cache_implementation="static", compile_config=CompileConfig(mode="reduce-overhead"))
                except Exception as e:  # recorded: the anchor's own try failed in transformers' CUDA-graph path
                    row["hf_static_graphs_error"] = f"{type(e).__name__}: {str(e)[:400]}"
            save()

    def at_once(eng, N: int) -> list[list[int]]:
        """N requests of the prompt submitted together, every answer's tokens."""
        hs = [eng.submit(ids[0].tolist(), n, stop_ids=frozenset()) for _ in range(N)]
        return [[e.token_id for e in h] for h in hs]

    def hf_rate(batch, **kw) -> float:
        """transformers' generate of `batch` for n tokens (a short warm-up outside the measured run; with a static cache
        and its compiled forward, the warm-ups are the compile and graph capture)."""
        with torch.inference_mode():
            for _ in range(2 if kw else 1):
                lm.model.generate(batch, max_new_tokens=4, min_new_tokens=4, do_sample=False, **kw)
            sync()
            t = time.perf_counter()
            lm.model.generate(batch, max_new_tokens=n, min_new_tokens=n, do_sample=False, **kw)
            sync()
            return batch.shape[0] * n / (time.perf_counter() - t)

    def free_device():
        import gc

        gc.collect()
        if lm.device.type == "cuda":
            torch.cuda.empty_cache()

    def sync():
        if lm.device.type == "cuda":
            torch.cuda.synchronize()

    def gpu_idle_share(fn) -> dict:
        """The share of fn's wall time with no kernel running on the GPU: the union of the kernels' intervals
        (torch.profiler's CUDA activity, kernels inside graph replays included) against the span."""
        from torch.profiler import ProfilerActivity, profile

        sync()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            t = time.perf_counter()
            fn()
            sync()
            wall_us = (time.perf_counter() - t) * 1e6
        spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events() if e.device_type.name == "CUDA" and e.time_range.end > e.time_range.start)
        busy, end = 0.0, float("-inf")
        for a, b in spans:
            if b > end:
                busy += b - max(a, end)
                end = b
        return {"wall_ms": wall_us / 1000, "kernel_busy_ms": busy / 1000, "kernels": len(spans), "idle_share": max(0.0, 1 - busy / wall_us)}

    def graph_step_alone(eng) -> dict:
        """The engine's batch-1 decode graph (the bucket the N = 1 runs used, with the most steps a replay) replayed back
        to back: the engine's device floor per token, beside the fused step's (production)."""
        gs = eng.step.graphs
        keys = sorted((k for k, b in gs._buckets.items() if k[0] == 1 and b.graph is not None), key=lambda k: k[2])
        if not keys:
            return {"graph": None}
        b = gs._buckets[keys[-1]]  # the multi-step replay where the runs used one: its steps share one launch
        reps = 200
        for _ in range(10):
            b.graph.replay()
        sync()
        t = time.perf_counter()
        for _ in range(reps):
            b.graph.replay()
        sync()
        ms = (time.perf_counter() - t) / reps / b.steps * 1000
        return {"bucket (rows, blocks, steps)": list(keys[-1]), "ms_per_token": ms, "tokens_per_s": 1000 / ms}

    def exact():
        """Issue 34 on this device: one request's every step's logits served alone, then beside 7 and 31 other requests
        that arrive after its first token (their prompt chunks and decode rows in its passes), and with its prompt
        served from the prefix cache (alone and beside 31), compared bit for bit: 0 differing values on a CPU with the
        C kernels; on a GPU the torch path's count (cuBLAS and SDPA may choose their reduction order by shape:
        docs/findings.md, "Exact on a GPU")."""
        from pipeline.engine import Engine

        p = ids[0].tolist()

        def steps(n_others: int, prefix: bool, graphs: bool | None = None) -> list:
            eng = Engine(lm, prefix_cache=prefix, background=False, graphs=graphs, kv_pool_bytes=1 << 30)
            if prefix:  # the prompt's blocks cached by an earlier request
                eng.submit(p, 2, stop_ids=frozenset())
                while eng.iterate() is not None:
                    pass
            h = eng.submit(p, 24, stop_ids=frozenset(), keep_logits=True)
            eng.iterate()
            for k in range(n_others):  # prompts of many lengths, some sharing its first tokens
                eng.submit(p[: max(2, len(p) // 2 + (3 * k) % 40)] + [17 + k] * (k % 50), 32, stop_ids=frozenset())
            while eng.iterate() is not None:
                pass
            logits = [e.logits for e in h]
            del eng, h
            free_device()  # ten engines one after another: each pool freed before the next
            return logits

        out = res["exact"] = {}
        for graphs in (None, False):  # the device's default (graphs on a GPU), then without them
            alone = steps(0, False, graphs)
            key = "" if graphs is None else "no_graphs "
            out["steps"], out["logits_compared_per_case"] = len(alone), sum(a.numel() for a in alone)
            for name, (n_others, prefix) in {
                "others_7": (7, False),
                "others_31": (31, False),
                "prefix_hit_alone": (0, True),
                "prefix_hit_others_31": (31, True),
            }.items():
                s = steps(n_others, prefix, graphs)
                out[key + name] = {
                    "differing_values": sum(int((a != b).sum()) for a, b in zip(alone, s)),
                    "largest_difference": max(float((a.float() - b.float()).abs().max()) for a, b in zip(alone, s)),
                    "same_tokens": [int(a.argmax()) for a in alone] == [int(b.argmax()) for b in s],
                }
                save()

    def cpu():
        """The CPU decode path (pipeline.decode_step.cpu.row_step, with pipeline/decode_step/cpu/cpu_decode.c where it builds) on this machine's own
        processors, fp32: the memory's read speed (pipeline.decode_step.cpu.bandwidth's C probe over a buffer as large as the
        weights; torch summing every weight beside it, which under-reads) and one request's decode tokens/s, the row
        step against transformers' loop, with its share of that limit."""
        from pipeline.decode_step.choice import CHOICE
        from pipeline.decode_step.cpu import row_step
        from pipeline.decode_step.cpu.bandwidth import read_probe

        cpu_lm = random_model(ROOT / "bench" / "assets" / "smollm2-shape", device="cpu")
        ws = [p.detach() for p in cpu_lm.model.parameters()]
        nbytes = sum(w.numel() * w.element_size() for w in ws)
        ts = []
        for _ in range(5):
            t = time.perf_counter()
            for w in ws:
                w.sum()
            ts.append(time.perf_counter() - t)
        probe = read_probe(max(nbytes, 1 << 20))
        out = res["cpu"] = {
            "threads": torch.get_num_threads(),
            "dtype": str(cpu_lm.dtype),
            "row_step": row_step.usable(cpu_lm),
            "native_kernels": CHOICE.c_kernels(),  # pipeline/decode_step/cpu/cpu_decode.c built (gcc, AVX2) or the fallback
            "read_gb_per_s": probe.gb_per_s,
            "read_kernel": probe.kernel,
            "limit_tokens_per_s": probe.gb_per_s * 1e9 / nbytes,
            "torch_sum_read_gb_per_s": nbytes / statistics.median(ts) / 1e9,
        }
        for mode in ("dynamic", "fused"):
            runs = [metrics(list(generate(cpu_lm, prompt, 64, chat=True, cache=mode, stop_ids=set()))).tokens_per_s for _ in range(args.reps)]
            out[mode] = {"decode_tokens_per_s": statistics.median(runs), "runs": runs, "share_of_limit": statistics.median(runs) / out["limit_tokens_per_s"]}
            save()

    for name, fn in (
        ("production", production),
        ("serving", serving),
        ("exact", exact),
        ("loop", loop),
        ("kernels", kernels),
        ("speculative", speculative),
        ("cpu", cpu),
    ):
        section(name, fn)
    print(json.dumps({k: v for k, v in res.items() if k not in ("telemetry", "attention_kernels")}, indent=1, default=float))
    print("->", path)


def headline(res: dict) -> dict:
    """The figures docs/benchmarks.md shows first (copied from the sections below in the same file)."""
    prod, serving, exact, cpu = res.get("production", {}), res.get("serving", {}), res.get("exact", {}), res.get("cpu", {})
    out = {f"{m} tokens/s": prod[m]["tokens_per_s"] for m in ("dynamic", "static", "fused", "fused+compile") if m in prod}
    for mode in ("plain", "compile", "torch_graph"):
        if f"step_floor_{mode}" in prod:
            out[f"fused step alone ({prod[f'step_floor_{mode}']['mode']}) ms"] = prod[f"step_floor_{mode}"]["step_ms"]
    for n, row in serving.items():
        if isinstance(row, dict) and "requests" in row:
            out[f"serving {n} requests: engine with graphs / without / transformers static / static with graphs tokens/s"] = [
                row.get(k) for k in ("graphs_tokens_per_s", "no_graphs_tokens_per_s", "hf_static_tokens_per_s", "hf_static_graphs_tokens_per_s")
            ]
            out[f"serving {n} requests: answers equal to generate, with graphs / without"] = [
                row.get("graphs_answers_equal_generate"),
                row.get("no_graphs_answers_equal_generate"),
            ]
            if "graphs_gpu_idle_share" in row:
                out[f"serving {n} requests: GPU idle share with graphs"] = row["graphs_gpu_idle_share"]["idle_share"]
    if "graph_step_alone" in serving:
        out["engine batch-1 graph alone tokens/s"] = serving["graph_step_alone"].get("tokens_per_s")
    for case, row in exact.items():
        if isinstance(row, dict):
            out[f"exact {case}: differing logits"] = row["differing_values"]
    if cpu:
        out["cpu read probe GB/s"] = cpu["read_gb_per_s"]
        out["cpu fused decode share of the probe"] = cpu.get("fused", {}).get("share_of_limit")
    return out


if __name__ == "__main__":
    main()
