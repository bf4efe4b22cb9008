"""A class on the hosted demo, measured: visitors over a few minutes on a fresh demo-mode server (127.0.0.1 only).

Some visitors are real Chromium tabs doing the class's path with their own prompt: the overview, pages 1-5,
then page 6 generating 8 greedy tokens (checked against the same request generated alone: no cross-talk), and
every few rounds one heavy sweep (page 7, through the demo's fair line). The rest use the engine API: each asks
its own question, one in four cancels after two tokens (a closed tab) and every finished answer is checked
against the same request alone. In-process (the default) the API visitors drive the engine in this process, the
same engine code the server runs; with LLM_EXPLORER_ENGINE set (make cluster) both reach the same Ray Serve engine.

Counted: visitors served, page times p50/p95, API time to first token and per-token time p50/p95, errors (must
be 0), cross-talk (must be 0), cancelled requests not freed (must be 0), the server's RSS after warm-up and at
the end (no growth over repeated distinct prompts).

    .venv/bin/python bench/bench_class.py [--minutes 5] [--browsers 4] [--api 28] [--switch] [--budget-gb G]

--switch: the demo server offers SmolLM2 and Gemma-3 and every other browser visitor switches the model (its link's
model_choice); with --budget-gb below the two models' footprint (3.7 GB) the server's model cache evicts one at
each switch and loads it again, so the run also shows that an evicted model's memory comes back. The server's RSS
is sampled every 2 s and reported by quarter of the run (levelled off: the last quarter's peak near the second's).
The server's memory grows by its shared trace cache (every visitor's prompt is new: 3-9 MB a trace) until that is
full; --trace-budget-mb small enough to fill in the first quarter shows the level (the default 1,200 MB fills after
~200 distinct prompts, about 70 minutes of this class).
"""

from __future__ import annotations

import argparse
import random
import sys
import threading
import time
import urllib.parse
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "browser"))
sys.path.insert(0, str(ROOT / "bench"))

SUBJECTS = ["the sea", "a volcano", "the moon", "a library", "bread", "rain", "a bicycle", "chess", "bees", "glass", "a river", "snow"]
PAGES = ["tokens", "embeddings", "attention", "layer", "next-token"]


def pct(xs, q):
    xs = sorted(xs)
    return None if not xs else xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


class Alone:
    """Each prompt's greedy answer generated alone (transformers' dynamic cache, no engine): the reference."""

    def __init__(self, lm):
        self.lm, self.memo, self.lock = lm, {}, threading.Lock()

    def __call__(self, prompt: str, n: int, chat: bool = True) -> list[int]:
        import pipeline

        with self.lock:
            key = (prompt, n, chat)
            if key not in self.memo:
                self.memo[key] = [e.token_id for e in pipeline.generate(self.lm, prompt, n, chat=chat, cache="dynamic")]
            return self.memo[key]


def browser_visitor(browser, server, prompt, want, stats, heavy=False, model=None, chat=True):
    """One visitor's path in a real tab; page times into stats["page_s"], problems into stats["errors"]. `model`: the
    model its link chooses (None: the server's first)."""
    from ui import click_button, no_exception, wait_idle

    from components.tokens import visible
    from pipeline import available_models

    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    try:
        t = time.perf_counter()
        # a selectbox bound to the link carries its option's label (Streamlit's query-param binding)
        pick = {"model_choice": next(m.label for m in available_models() if m.key == model)} if model else {}
        page.goto(f"{server}/?{urllib.parse.urlencode({'prompt': prompt, 'chat': str(chat).lower()} | pick)}", wait_until="domcontentloaded")
        page.wait_for_selector("h1", timeout=300_000)
        wait_idle(page, 300_000)
        stats["page_s"].append(time.perf_counter() - t)
        for path in PAGES:
            t = time.perf_counter()
            page.locator(f"[data-testid='stSidebarNavLink'][href$='/{path}']").first.click()
            wait_idle(page, 300_000)
            stats["page_s"].append(time.perf_counter() - t)
            no_exception(page)
        t = time.perf_counter()
        q = urllib.parse.urlencode({"prompt": prompt, "chat": str(chat).lower(), "gen_n": 8, "gen_t": "0.0"} | pick)
        page.goto(f"{server}/generation?{q}", wait_until="domcontentloaded")
        page.wait_for_selector("h1", timeout=300_000)
        wait_idle(page, 300_000)
        click_button(page, "Generate", 300_000)
        stats["page_s"].append(time.perf_counter() - t)
        no_exception(page)
        pills = [x.strip().rsplit(" ", 1)[0].strip() for x in page.locator(".st-key-gen_pick button").all_inner_texts()]
        expect = [(visible(t) or "∅").replace("\n", "").strip() for t in want]
        if pills != expect:
            stats["crosstalk"].append((model or "default", prompt, pills, expect))
        stats["by_model"][model or "default"] = stats["by_model"].get(model or "default", 0) + 1
        if heavy:
            page.locator("[data-testid='stSidebarNavLink'][href$='/prefill-decode']").first.click()
            wait_idle(page, 300_000)
            t = time.perf_counter()
            click_button(page, "Run the sweep", 600_000)
            stats["heavy_s"].append(time.perf_counter() - t)
            no_exception(page)
        stats["browser_visits"] += 1
    except Exception as e:  # noqa: BLE001 - counted, and the run goes on
        stats["errors"].append(f"browser {prompt!r}: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
    finally:
        page.close()  # the tab closes: nothing may keep running for it


def api_visitor(lm, alone, k, deadline, stats, rng):
    """Questions through the engine API until the deadline: own prompt each time, one in four cancelled."""
    from pipeline.engine import engine_for
    from pipeline.forward.sampling import GREEDY
    from pipeline.generation import prepare

    eng = engine_for(lm)
    i = 0
    while time.time() < deadline:
        prompt = f"Write one sentence about {SUBJECTS[(k + i) % len(SUBJECTS)]}."
        i += 1
        cancel = rng.random() < 0.25
        try:
            req = prepare(lm, prompt, 12, chat=True)
            t0 = time.perf_counter()
            h = eng.submit(req.prompt_ids, 12, GREEDY)
            got, last = [], t0
            for ev in h:
                now = time.perf_counter()
                (stats["ttft_s"] if not got else stats["token_s"]).append(now - last)
                last = now
                got.append(ev.token_id)
                if cancel and len(got) == 2:
                    break
            if cancel:
                stats["cancelled"] += 1
            else:
                if got != alone(prompt, 12):
                    stats["crosstalk"].append((prompt, got))
                stats["api_answers"] += 1
        except Exception as e:  # noqa: BLE001
            stats["errors"].append(f"api {prompt!r}: {type(e).__name__}: {e}")
        time.sleep(rng.uniform(0.5, 2.0))  # reading the answer


def run(
    minutes: float = 5.0,
    browsers: int = 4,
    api: int = 28,
    seed: int = 0,
    heavy_every: int = 3,
    switch: bool = False,
    budget_gb: float | None = None,
    trace_budget_mb: float | None = None,
) -> dict:
    import psutil
    from playwright.sync_api import sync_playwright
    from ui import CHROMIUM, FLAGS, free_port, start_server, stop_server

    import pipeline

    lm = pipeline.load_model()
    alone = Alone(lm)
    models = [pipeline.EMBEDDED] + ([pipeline.GEMMA] if switch and pipeline.model.gemma_installed() else [])
    others = {k: Alone(pipeline.load_model(k)) for k in models[1:]}  # references for the other model's answers
    env = {"LLM_EXPLORER_DEMO": "1", "LLM_EXPLORER_MODELS": ",".join(models)}
    if budget_gb is not None:
        env["LLM_EXPLORER_MODEL_BUDGET_GB"] = str(budget_gb)
    if trace_budget_mb is not None:
        env["LLM_EXPLORER_TRACE_BUDGET_MB"] = str(trace_budget_mb)
    proc, server = start_server(free_port(), env=env)
    rss = []
    stats = {
        "page_s": [],
        "heavy_s": [],
        "ttft_s": [],
        "token_s": [],
        "errors": [],
        "crosstalk": [],
        "browser_visits": 0,
        "api_answers": 0,
        "cancelled": 0,
        "by_model": {},
    }
    stop = threading.Event()

    def sample():
        p = psutil.Process(proc.pid)
        while not stop.wait(2.0):
            rss.append((time.time(), p.memory_info().rss))

    threading.Thread(target=sample, daemon=True).start()
    t_start = time.time()
    warm_rss = None
    counter, clock = [0], threading.Lock()

    def tab_worker():
        """One Chromium of its own (Playwright's sync API is one driver per thread): visitor after visitor, each with
        a prompt of their own, until the deadline."""
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            while time.time() < deadline:
                with clock:
                    n = counter[0]
                    counter[0] += 1
                prompt = f"Tell me a fact about {SUBJECTS[n % len(SUBJECTS)]} ({n})."
                model = models[n % len(models)]
                if model == models[0]:
                    want = [lm.tokenizer.decode([t]) for t in alone(prompt, 8)]
                    browser_visitor(browser, server, prompt, want, stats, heavy=n % (browsers * heavy_every) == heavy_every, model=model if switch else None)
                else:  # a base model without a chat template: the prompt as typed
                    ref = others[model]
                    want = [ref.lm.tokenizer.decode([t]) for t in ref(prompt, 8, chat=False)]
                    browser_visitor(browser, server, prompt, want, stats, heavy=n % (browsers * heavy_every) == heavy_every, model=model, chat=False)
            browser.close()

    try:

        def warm_up():  # one visitor's path (model loaded, caches filled), then the measured run
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
                browser_visitor(browser, server, "Why is the sky blue?", [lm.tokenizer.decode([t]) for t in alone("Why is the sky blue?", 8)], stats)
                browser.close()

        # every Chromium in a thread of its own: Playwright's sync API refuses a thread with a running asyncio loop,
        # which an earlier browser test in the same pytest session leaves in the main thread
        w = threading.Thread(target=warm_up)
        w.start()
        w.join()
        warm_rss = psutil.Process(proc.pid).memory_info().rss
        stats.update(page_s=[], browser_visits=0)
        deadline = time.time() + 60 * minutes
        rngs = [random.Random(seed * 1000 + k) for k in range(api)]
        workers = [threading.Thread(target=api_visitor, args=(lm, alone, k, deadline, stats, rngs[k]), daemon=True) for k in range(api)]
        workers += [threading.Thread(target=tab_worker, daemon=True) for _ in range(browsers)]
        for w in workers:
            w.start()
        for w in workers:
            w.join(60 * minutes + 900)
        eng = pipeline.engine.engine_for(lm)
        time.sleep(2.0)
        left = eng.stats()
    finally:
        stop.set()
        end_rss = psutil.Process(proc.pid).memory_info().rss
        stop_server(proc)
    return {
        "minutes": round((time.time() - t_start) / 60, 2),
        "visitors": {
            "browser visits": stats["browser_visits"],
            "api visitors": api,
            "api answers checked": stats["api_answers"],
            "api cancelled": stats["cancelled"],
        },
        "page_s": {"n": len(stats["page_s"]), "p50": pct(stats["page_s"], 50), "p95": pct(stats["page_s"], 95)},
        "heavy_sweep_s": stats["heavy_s"],
        "api_ttft_s": {"p50": pct(stats["ttft_s"], 50), "p95": pct(stats["ttft_s"], 95)},
        "api_token_s": {"p50": pct(stats["token_s"], 50), "p95": pct(stats["token_s"], 95)},
        "errors": stats["errors"],
        "crosstalk": [list(map(str, c)) for c in stats["crosstalk"]],
        "cancelled_not_freed": {"running": left.running, "waiting": left.waiting, "blocks_used": left.blocks_used},
        "server_rss_mb": {
            "after_warm_up": round(warm_rss / 2**20),
            "end": round(end_rss / 2**20),
            "max": round(max(r for _, r in rss) / 2**20) if rss else None,
            "peak_by_quarter": quarters(rss),
            "levelled_off": levelled(quarters(rss)),
        },
        "models": models,
        "browser_visits_by_model": stats["by_model"],
        "model_budget_gb": budget_gb,
        "trace_budget_mb": trace_budget_mb if trace_budget_mb is not None else 1200,
        "api_engine": "in this process (same engine code as the server)" if not __import__("os").environ.get("LLM_EXPLORER_ENGINE") else "Ray Serve",
    }


def quarters(samples: list[tuple[float, int]]) -> list[int]:
    """The peak RSS (MB) in each quarter of the run."""
    if not samples:
        return []
    t0, t1 = samples[0][0], samples[-1][0]
    span = max(t1 - t0, 1e-9)
    out = [0, 0, 0, 0]
    for t, r in samples:
        q = min(3, int(4 * (t - t0) / span))
        out[q] = max(out[q], round(r / 2**20))
    return out


def levelled(peaks: list[int], slack_mb: int = 100) -> bool | None:
    """Levelled off: the last quarter's peak is within `slack_mb` of the second quarter's (the first quarter holds the
    loads and the trace cache's filling)."""
    return None if len(peaks) < 4 else peaks[3] <= peaks[1] + slack_mb


def main():
    from common import write

    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--browsers", type=int, default=4)
    ap.add_argument("--api", type=int, default=28)
    ap.add_argument("--switch", action="store_true", help="SmolLM2 and Gemma-3 on the server, every other visitor switching")
    ap.add_argument("--budget-gb", type=float, default=None, help="the server's model cache budget (LLM_EXPLORER_MODEL_BUDGET_GB)")
    ap.add_argument("--trace-budget-mb", type=float, default=None, help="the server's shared trace cache (LLM_EXPLORER_TRACE_BUDGET_MB; default 1,200 MB)")
    ap.add_argument("--out", default="class_load")
    a = ap.parse_args()
    write(a.out, run(a.minutes, a.browsers, a.api, switch=a.switch, budget_gb=a.budget_gb, trace_budget_mb=a.trace_budget_mb))


if __name__ == "__main__":
    main()
