"""docs/benchmarks.md from bench/results/*.json: every figure in the doc is read from a result file, none typed by
hand. Each section says what the bench measures and the command that writes its file (the words live here; the
numbers in the JSON). Run after any bench: `python bench/report.py` (`make bench` does)."""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
OUT = ROOT / "docs" / "benchmarks.md"
MAX_ROWS = 40  # per section; the rest stay in the JSON

# what each result file measures and how to make it again (no figures here: they come from the files)
ABOUT = {
    "cpu_anchor": (
        "One request's CPU decode against the machine's read-bandwidth limit and CTranslate2 (float32, int8), the engine "
        "(passes of up to 8 greedy decode steps where nobody waits; engine-1-onestep: a token a pass, for contrast) "
        "at 1, 8 and 32 requests against CTranslate2's static batches, the same on the fallback kernels (without "
        "pipeline/decode_step/cpu/cpu_decode.c), one request under a second busy process (the fallback with and without its thread plan); "
        "a fresh process per configuration, rotated repeats, greedy agreement with transformers.",
        "bench/bench_cpu_anchor.py --reps 3",
    ),
    "gpu_check": (
        "The prepared GPU run (one lent NVIDIA H200, bf16, SmolLM2-135M's shape with seeded random weights): greedy decode "
        "with the dynamic cache, the static cache, our fused step as a CUDA graph (of the trimmed Triton kernels where they "
        "serve, and of the torch step beside it) and compiled then captured; the engine at "
        "1-256 requests with its decode passes as CUDA graphs and without, every answer against generate, the GPU's idle "
        "share, against transformers' static batch of the same size, eager and with its own CUDA graphs; one request's "
        "logits alone against beside 7 and 31 others and from the prefix cache, bit for bit, with and without the graphs; "
        "the machine's 16 CPU cores on the C decode path. The figures below are from the last lent device's run, made "
        "before the engine's graphs and the trimmed step landed (2026-12-06; no device lent since): their rows appear with "
        "the next. The "
        "headline copies the key figures from the sections; the two anchor rows are ../shared/gpu-anchors' 2026-11-30 "
        "reference figures, measured with another script. It runs on the lent device machine and writes its JSON under $OUT.",
        "bench/gpu_check.py",
    ),
    "lifetime": (
        "Memory over load/use/drop cycles in one process (SmolLM2: load, one generation through the engine and one through "
        "the fused loop, drop, collect): RSS after each cycle, whether the model was freed, what each answered.",
        "bench/bench_lifetime.py --cycles 3",
    ),
    "node_failure": (
        "A two-node Ray cluster on one machine (head and worker as separate `ray start` processes, one engine replica on "
        "each), the worker node killed while 6 greedy answers stream: how each request ended and when, a request sent just "
        "after the kill and one after it, how long until the replica runs again on the restarted node.",
        "bench/bench_node_failure.py",
    ),
    "class_term": (
        "A term's worth of load: the demo server (SmolLM2 and Gemma-3) under a class for 30 minutes, 4 Chromium tabs whose "
        "visitors switch model every other visit (every twelfth runs page 7's sweep) and 28 engine-API visitors (one in four "
        "cancelling): errors, answers equal to the same request alone, the server's RSS peak by quarter. The shared trace "
        "cache's budget is 150 MB here, so that it fills in the first quarter (every visitor's prompt is new, 3-9 MB a trace): "
        "after it, RSS must stay level (the last quarter's peak within 100 MB of the second's). The default budget, 1,200 MB, "
        "fills after ~200 distinct prompts.",
        "bench/bench_class.py --minutes 30 --switch --trace-budget-mb 150 --out class_term",
    ),
    "first_visit": (
        "The overview's forward-pass time on a freshly started server against pipeline.trace in a plain process, three visits.",
        "bench/bench_first_visit.py --reps 5",
    ),
    "long_trace": (
        "A trace of every stage against the model's own forward at 37, 1,024, 4,096 and ~8,000 tokens (SmolLM2, fp32, "
        "prose; the same ids, no cache, the LM head on the last position, the same threads; alternated, warm-ups outside, "
        "median and spread of each side and of the per-pair ratio; goal <= 1.15). The trace runs SDPA and keeps every "
        "layer's queries, keys and values; trace_kept_mb is what it holds before any map is read; one layer's pooled map "
        "and the all-layer overview are then computed from them (what the attention page asks for, once per trace).",
        "bench/bench_long_trace.py",
    ),
    "steps_off": (
        'A generation nobody records (our decode loop, greedy, 48 tokens of the chat "Why is the sky blue?") in this '
        "checkout against the commit before the decode-step recording landed (a git worktree), each side in its own process, "
        "alternated pair by pair; the median tokens/s ratio (goal ~1.0) and its spread; and, for scale, recording every "
        "layer's newest query (pipeline.generation.steps) beside it.",
        "bench/bench_steps_off.py --pairs 6",
    ),
    "trace": ("A trace of every stage against a plain transformers forward of the same prompt, at several prompt lengths.", "bench/bench_trace.py"),
    "memory": ("Peak extra memory while tracing a long prompt, and how fast the attention page answers a layer change.", "bench/bench_memory.py"),
    "generate": ("Our decode loop against transformers' model.generate (greedy), and what the telemetry sampler costs.", "bench/bench_generate.py"),
    "production": ("The same greedy request with the dynamic cache, the static cache and the fused step, interleaved repeats.", "bench/bench_production.py"),
    "faster": ("Attention kernels (eager vs SDPA backends), and speculative decoding with each draft, in one run.", "bench/bench_faster.py --reps 1"),
    "linear": (
        "The engine's batched step on a CPU by case (decode rows, prompt chunks): the row step with pipeline.decode_step.cpu.matmul's kernels "
        "(pipeline/decode_step/cpu/cpu_decode.c), the torch step with them, and the torch step with F.linear; each layout's logits against F.linear's.",
        "bench/bench_linear.py",
    ),
    "serving": (
        "Many visitors at once: our engine against one loop per visitor and transformers' static batch, by concurrency.",
        "bench/bench_serving.py --workloads same,mixed --ns 1,4,8,16,32",
    ),
    "serving_latency": (
        "Time to first token and per-token latency for staggered, steady and long-prompt arrivals.",
        "bench/bench_serving.py --workloads staggered,steady,long-prompt --ns 1,8,16 --methods threads,engine --out serving_latency",
    ),
    "serving_parking": ("A short question arriving while a long prompt is prefilled, with and without parking.", "bench/bench_serving.py (parking A/B)"),
    "serving_prefill_first": (
        "A question arriving while others decode: prefill first (bounded) against mixed passes.",
        "bench/bench_serving.py (prefill-first A/B)",
    ),
    "serving_prefix": ("The prefix cache: chat prompts sharing the template's system turn, with and without the cache.", "bench/bench_serving.py (prefix A/B)"),
    "serving_prefix_staggered": ("The prefix cache with staggered arrivals.", "bench/bench_serving.py (prefix A/B, staggered)"),
    "fairness": ("Other visitors' pages while a heavy experiment runs (the fair model lock).", "bench/bench_fairness.py"),
    "fairness_before": ("The same, before the fair lock (kept for comparison).", "bench/bench_fairness.py (before)"),
    "class_load": ("A class on the demo server: browsers and API visitors at once for minutes; answers checked, memory and leaks.", "bench/bench_class.py"),
    "why_smollm2": (
        "Why this token on a 64-token prompt (SmolLM2): the page's trace, then attribution and the contribution graph (goal: "
        "both within 1 s after the trace), an intervention switching the 5 largest heads off against the trace's time, each "
        "beside a plain forward, interleaved repeats; and the patching grids for 16 tokens x every layer, by position and by "
        "head (goal: within 10 s on this CPU).",
        "bench/bench_why.py --reps 7",
    ),
    "live_class": (
        "A live class: one presenter and N followers (each its own Chromium context, figures not drawn) on a fresh server; "
        "the presenter changes page or prompt every 20 s and each follower's page records when it shows the change: delay "
        "p50/p95/max (goal: p95 within 3 s), changes missed, errors, the server's CPU and RSS, the whole machine's CPU and "
        "the browsers'; server_delay_s is the server's own log, from the presenter's view published to each follower's run "
        "drawing it (two views per change when both prompt and page move). The server runs at priority -10 (server_nice): "
        "in a class it has its own machine, here it shares the 2 cores with the 31 Chromium pages. Followers are woken by "
        "the presenter's run and draw figures built once per server (docs/architecture.md, the live class). One follower: "
        "see live_class_1.",
        "bench/bench_live_class.py --followers 30 --minutes 5",
    ),
    "live_class_sockets": (
        "The same class with its 30 followers as clients of Streamlit's websocket protocol (bench/socket_follower.py: "
        "the join link's session, the pages and the address read from the server's messages) instead of Chromium pages: "
        "the server delivering each change to 30 students who each have a machine of their own, the presenter still a "
        "Chromium page. The browsers' own drawing is not in it (the Chromium run above measures that on this machine). "
        "The followers keep no timers: they show a change when the presenter's run wakes them, straight on the presenter's "
        "page. The presenter's run publishes as it starts and again after its page (publishes: a second only where the "
        "page's widgets changed the view); presenter_s and after_publish_s split each delay at the publishing.",
        "bench/bench_live_class.py --sockets --followers 30 --minutes 5 --out live_class_sockets",
    ),
    "exact_smollm2": (
        "What exactness costs (SmolLM2): every CPU engine pass through the row step (products in a fixed order for any "
        "number of rows, so a request's logits are bit for bit the same whatever shares its passes) against the torch "
        "path prompt chunks took before; prefills and a chunk beside 8 decode rows, interleaved, medians (ms). Below 1: "
        "the exact path is faster.",
        "bench/bench_exact.py --reps 7",
    ),
    "exact_gemma3": ("The same on Gemma-3 270M.", "bench/bench_exact.py --reps 7 --model gemma3-270m"),
    **{
        f"lecture_{n}_p{r}": (
            f"A lecture: {n} students as clients of Streamlit's websocket protocol (each with its own browser cookie) on "
            + ("one process" if r == 1 else f"{r} processes behind HAProxy (hosting/launch.py)")
            + ", the SQLite store, one presenter in Chromium moving page or prompt every 15 s (8 moves). delay_s: from each "
            "move to each student's page drawn to its end (script_finished). server_cpu_ms_per_student_per_move: every server "
            "process's CPU seconds over the moves, over students x moves; ..._per_s_idle: the same with nothing new to show "
            "(the heartbeats); store_us: the store's own time per operation (median of 200). The clients share this 2-core "
            "machine with the servers. Goal: p95 <= 3 s at 120 on one process and 300 on two.",
            f"bench/bench_live_class.py --sockets --followers {n} --replicas {r} --minutes 2 --every 15 --out lecture_{n}_p{r}",
        )
        for n in (30, 120, 300)
        for r in (1, 2)
    },
    **{
        f"wake_{m}_30": (
            "How a live class's 30 followers learn of a move, on one process (websocket clients, moves every 15 s, 1.5 min): "
            + (
                "public Streamlit only, each follower's st.fragment(run_every='1s') heartbeat reading the class "
                "(LLM_EXPLORER_LIVE_WAKE=0; the clients run the fragments' timers as a browser does)"
                if m == "public"
                else "the watcher waking each follower's session through Streamlit's private runtime (views.live_wake)"
            )
            + ". Compare server_cpu_ms_per_student_per_s_idle (what following costs with nothing to show) and delay_s.",
            f"bench/bench_live_class.py --sockets {'--public-wake ' if m == 'public' else ''}--followers 30 --minutes 1.5 --every 15 --idle 15 --out wake_{m}_30",
        )
        for m in ("public", "wake")
    },
    "live_class_1": (
        "The same with one follower (a quiet server): how long a student's page takes to follow the presenter to another "
        "page or prompt (the held-out bar: 2 s quiet, 5 s on this 2-core machine). first_follower lists each change; a "
        "change the follower showed before the presenter's action (its prompt already there) counts as missed.",
        "bench/bench_live_class.py --followers 1 --minutes 2 --every 15 --out live_class_1",
    ),
    "why_gemma3": ("The same on Gemma-3 270M (18 layers, sandwich norms).", "bench/bench_why.py --reps 7 --model gemma3-270m"),
    "int8": (
        'int8 weight-only serving on the CPU (`load_model(key, precision="int8")`): one request\'s greedy decode through the '
        "engine in our fp32, our int8 (per-row scales, int8 panels widened to fp32 in registers) and CTranslate2 int8 on "
        "the same weights, in one run, interleaved; eight at once (prefill included) against CTranslate2 int8's static "
        "batch of 8; the top-1 agreement of the int8 model with fp32 over 32 chat prompts (fp32's answers teacher-forced).",
        "bench/bench_int8.py --reps 2",
    ),
    "eta": (
        "The wait a queued visitor is told against its real wait, in seconds: one request alone (a quiet spell), then 24 at "
        "once on an engine serving 8 at a time (a background engine, as the app runs it); the told / real ratio per request, "
        "and the engine's measured time per decode step (what the estimate multiplies by) against the steps' real time. "
        "tests/pipeline/test_engine.py holds the same scene in decode steps, without the clock.",
        "bench/bench_eta.py --reps 3",
    ),
}


def fmt(v) -> str:
    if isinstance(v, bool) or v is None:
        return str(v).lower() if v is not None else "—"
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        return f"{v:,.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    if isinstance(v, list):
        nums = [x for x in v if isinstance(x, int | float) and not isinstance(x, bool)]
        if nums and len(nums) == len(v):
            if len(v) <= 8:
                return "[" + ", ".join(fmt(x) for x in v) + "]"
            return f"{len(v)} values, median {fmt(statistics.median(v))} (range {fmt(min(v))}–{fmt(max(v))})"
        if all(isinstance(x, str) for x in v):
            return "; ".join(v) if v else "none"
        return f"{len(v)} entries (see the JSON)"
    return str(v).replace("\n", " ")


def leaves(d, prefix=""):
    """(dotted key, value) for every leaf, lists of records summarised rather than expanded."""
    if isinstance(d, dict):
        for k, v in d.items():
            yield from leaves(v, f"{prefix}{k}." if isinstance(v, dict) else f"{prefix}{k}")
            if isinstance(v, dict) and not v:
                yield f"{prefix}{k}", "{}"
    else:
        yield prefix.rstrip("."), d


def section(name: str, data: dict) -> list[str]:
    what, cmd = ABOUT.get(name, ("(no description yet: add one to bench/report.py)", f"bench/{name}.py"))
    env = data.pop("env", {}) if isinstance(data, dict) else {}
    out = [f"## {name}", "", what, "", f"`python {cmd}` → `bench/results/{name}.json`"]
    if env:
        out += ["", f"Measured {env.get('when', '?')}: {env.get('cpus', '?')} CPUs, torch {env.get('torch', '?')}, CUDA {env.get('cuda') or 'none'}."]
    out += ["", "| figure | value |", "|---|---|"]
    rows = list(leaves(data))
    for k, v in rows[:MAX_ROWS]:
        out.append(f"| {k} | {fmt(v).replace('|', '/')} |")
    if len(rows) > MAX_ROWS:
        out.append(f"| … | {len(rows) - MAX_ROWS} more figures in the JSON |")
    return out + [""]


def render() -> str:
    lines = [
        "# Benchmarks",
        "",
        "Generated by `python bench/report.py` from `bench/results/*.json`: nothing here is typed by hand. The build",
        "machine is shared and noisy, so the benches take ratios within one run, interleave their repeats and report",
        "medians with their spread; compare figures within a section, not across days. What the headline figures say",
        "is in docs/performance.md, what they mean for the design in docs/architecture.md.",
        "",
    ]
    files = sorted(RESULTS.glob("*.json"), key=lambda p: (list(ABOUT).index(p.stem) if p.stem in ABOUT else len(ABOUT), p.stem))
    for p in files:
        lines += section(p.stem, json.loads(p.read_text()))
    return "\n".join(lines)


def main(argv=None) -> int:
    text = render()
    if argv and "--check" in argv:  # CI: the doc is what the results say
        if OUT.read_text() != text:
            print("docs/benchmarks.md is stale: run python bench/report.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)} ({len(text.splitlines())} lines)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
