"""A live class under load: one presenter and N followers (each its own Chromium context, so its own cookie) on a fresh
server for a few minutes. The presenter changes page or prompt every `--every` seconds; every follower's page records
(in the page, every 100 ms) when its address reaches the presenter's page and prompt. Counted: the delay from the
presenter's change to each follower showing it (p50, p95, max), changes a follower missed, errors on any page, the
server's CPU (mean and peak, of one core) and RSS (after warm-up and at the end), and the whole machine's CPU and the
browsers' (Chromium and Playwright's driver), to tell the server's delivery from the browsers' own share. The server logs its own figure too
(LLM_EXPLORER_CLASS_LOG): from the presenter's run publishing a view to each follower's run drawing it to its end, which
leaves out the browsers' share. The presenter's publishing is logged too, which splits each delay in two: the
presenter's own share (its Chromium taking the bench's typing or click, and its run: on this machine's 2 cores beside
every client) and the server's delivery from the publishing to each follower's address.

By default the followers' pages do not draw their Plotly figures (the chart's code is not served to them): 30 Chromium
pages drawing every figure on this machine's 2 cores measured the browsers, not the server (p50 35 s, p95 70 s, 82 of
270 changes missed, with the server at 35% of one core). A class has 30 machines; --draw measures the other case.

The server runs at priority -10 (--server-nice; every thread): in a class it has its own machine, while here the
2 cores' scheduler shared them evenly between the server and the 31 Chromium pages' processes, and the server, idle
four fifths of the time, ran a change seconds late (server side p95 37 s at 20% of one core, 2026-12-04). The browser-side delay still
includes the browsers' own rendering on the same 2 cores.

    .venv/bin/python bench/bench_live_class.py [--followers 30] [--minutes 5] [--every 20] [--draw] [--server-nice N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "browser"))
sys.path.insert(0, str(ROOT / "bench"))

# the presenter's walk: (page, prompt), repeated; consecutive steps differ in page or prompt
STEPS = [
    ("tokens", "The capital of France is"),
    ("attention", "The capital of France is"),
    ("attention", "Dog bites man."),
    ("layer", "Dog bites man."),
    ("next-token", "Dog bites man."),
    ("tokens", "Why is the sky blue?"),
]
WATCH = """() => { window.__seen = []; let last = '';
  setInterval(() => { const now = location.pathname + '|' + (document.querySelector('[data-testid=stSidebar] textarea')?.value || '');
    if (now !== last) { last = now; window.__seen.push([now, Date.now()]); } }, 100); }"""


class SocketFollowers:
    """n students as websocket clients (bench/socket_follower.py) on one event loop in a thread of their own."""

    def __init__(self, url: str, code: str, n: int, timers: bool = False):
        import asyncio

        import socket_follower

        self.loop, self.seen, self.errors = asyncio.new_event_loop(), [[] for _ in range(n)], []
        self.stop = asyncio.Event()

        async def all_of_them():
            await asyncio.gather(*(socket_follower.follow(url, code, s, self.stop, self.errors, timers) for s in self.seen), return_exceptions=True)

        self.thread = threading.Thread(target=lambda: self.loop.run_until_complete(all_of_them()), daemon=True)
        self.thread.start()

    def wait_joined(self, timeout: float) -> int:
        """How many showed a page within `timeout` seconds."""
        end = time.time() + timeout
        while time.time() < end and not all(self.seen):
            time.sleep(0.5)
        return sum(1 for s in self.seen if s)

    def close(self) -> list:
        self.loop.call_soon_threadsafe(self.stop.set)
        self.thread.join(10)
        return self.seen


def prioritise(pid: int, nice: int) -> None:
    """Every thread of process `pid` at scheduling priority `nice` (Linux: a priority is per thread)."""
    if not nice:
        return
    import os

    for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
        try:
            if os.getpriority(os.PRIO_PROCESS, int(tid)) != nice:
                os.setpriority(os.PRIO_PROCESS, int(tid), nice)
        except OSError:  # a thread that ended, or no right to raise a priority: as it is
            pass


def pct(xs, q):
    xs = sorted(xs)
    return None if not xs else xs[min(len(xs) - 1, int(round(q / 100 * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--followers", type=int, default=30)
    ap.add_argument("--minutes", type=float, default=5)
    ap.add_argument("--every", type=float, default=20, help="seconds between the presenter's changes")
    ap.add_argument("--out", default="live_class", help="the result's name under bench/results/")
    ap.add_argument(
        "--server-nice",
        type=int,
        default=-10,
        help="the server's scheduling priority (every thread; 0: as started): in a class the server has its own machine, "
        "here it shares 2 cores with 31 Chromium pages, which left it a thirtieth of them",
    )
    ap.add_argument(
        "--sockets",
        action="store_true",
        help="followers are clients of Streamlit's websocket protocol (bench/socket_follower.py), not Chromium pages: the "
        "server's delivery to students on machines of their own, without 30 browsers on this machine's 2 cores",
    )
    ap.add_argument("--replicas", type=int, default=1, help="app processes behind HAProxy (hosting/launch.py); 1: one process, no balancer")
    ap.add_argument("--store", default="", help="the hall's store: '' the SQLite file, 'redis' a redis-server of the launcher's")
    ap.add_argument("--idle", type=float, default=20, help="seconds measured with every follower joined and no move, before the first")
    ap.add_argument(
        "--public-wake",
        action="store_true",
        help="followers woken by public Streamlit only: the server with LLM_EXPLORER_LIVE_WAKE=0 (each follower's "
        "st.fragment(run_every='1s') heartbeat finds the move), the socket followers running the fragments' timers as a browser does",
    )
    ap.add_argument("--draw", action="store_true", help="followers draw their figures too (30 Chromium pages on this machine's 2 cores)")
    args = ap.parse_args()
    import json
    import tempfile

    import psutil
    from common import write
    from playwright.sync_api import sync_playwright
    from ui import CHROMIUM, FLAGS, free_port, set_prompt, start_server, stop_server, wait_idle

    log = Path(tempfile.mkdtemp()) / "class.jsonl"  # the server's own figure: publish -> a follower's page drawn
    state = tempfile.mkdtemp(prefix="llmx-bench-")
    if args.replicas > 1:
        import os
        import subprocess
        import urllib.request

        port = free_port()
        env = dict(os.environ, LLM_EXPLORER_CLASS_LOG=str(log), LLM_EXPLORER_STATE_DIR=state, LLM_EXPLORER_LIVE_WAKE="0" if args.public_wake else "1")
        proc = subprocess.Popen(
            [sys.executable, "-m", "hosting.launch", f"--replicas={args.replicas}", f"--port={port}", "--address=127.0.0.1", f"--store={args.store}"],
            cwd=ROOT,
            env=env,
        )
        url = f"http://127.0.0.1:{port}"
        for _ in range(600):
            try:
                urllib.request.urlopen(url + "/_stcore/health", timeout=1)
                break
            except Exception:  # noqa: BLE001
                time.sleep(0.5)
    else:
        proc, url = start_server(
            free_port(), env={"LLM_EXPLORER_CLASS_LOG": str(log), "LLM_EXPLORER_STATE_DIR": state, "LLM_EXPLORER_LIVE_WAKE": "0" if args.public_wake else "1"}
        )
    cpu_at: list[float] = []

    def cpu_seconds() -> float:
        """User + system seconds of the server's processes (every app process, HAProxy, the store's server)."""
        p = psutil.Process(proc.pid)
        total = 0.0
        for k in [p, *p.children(recursive=True)]:
            try:
                t = k.cpu_times()
                total += t.user + t.system
            except psutil.Error:
                pass
        return total

    cpu, rss, machine, browsers, stop = [], [], [], [], threading.Event()
    me = psutil.Process()

    def sample():
        p = psutil.Process(proc.pid)
        p.cpu_percent()
        psutil.cpu_percent()
        seen: dict[int, psutil.Process] = {}
        while not stop.wait(2):
            for k in [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]:
                prioritise(k, args.server_nice)  # threads started since (the script runs') too
            try:
                kids = [p, *p.children(recursive=True)]
                cpu.append(sum(k.cpu_percent() for k in kids))
                rss.append(sum(k.memory_info().rss for k in kids))
                machine.append(psutil.cpu_percent() * psutil.cpu_count())  # every process, in % of one core
                total = 0.0
                for k in me.children(recursive=True):  # Playwright's driver and the Chromium processes (not the server)
                    if k.pid != proc.pid and k.pid not in {c.pid for c in kids}:
                        q = seen.setdefault(k.pid, k)
                        total += q.cpu_percent()
                browsers.append(total)
            except psutil.Error:
                pass

    prioritise(proc.pid, args.server_nice)
    threading.Thread(target=sample, daemon=True).start()
    changes, errors, presenter_off = [], [], []
    try:
        with sync_playwright() as pw:
            b = pw.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
            teacher = b.new_context(viewport={"width": 1280, "height": 800}).new_page()
            teacher.goto(f"{url}/tokens?prompt={quote(STEPS[0][1])}", wait_until="domcontentloaded")
            teacher.wait_for_selector("h1", timeout=300_000)
            wait_idle(teacher, 300_000)
            teacher.get_by_role("button", name="Start a live class").click()
            wait_idle(teacher)
            teacher.get_by_role("button", name="Live class").first.click()
            link = teacher.locator("[data-testid='stPopoverBody'] code").first.inner_text().strip()
            teacher.keyboard.press("Escape")
            followers = []
            sockets = SocketFollowers(url, link.split("follow=")[1][:8], args.followers, timers=args.public_wake) if args.sockets else None
            for _ in range(0 if sockets else args.followers):
                ctx = b.new_context(viewport={"width": 1024, "height": 700})
                ctx.add_init_script(f"({WATCH})()")
                if not args.draw:  # the server's delivery, not 30 browsers drawing on one 2-core machine (a class has 30)
                    ctx.route("**/PlotlyChart*.js", lambda r: r.abort())
                page = ctx.new_page()
                page.on("pageerror", lambda e: None if not args.draw and "PlotlyChart" in str(e) else errors.append(str(e)[:200]))
                page.goto(link, wait_until="commit", timeout=300_000)  # 30 sessions starting at once on 2 cores
                followers.append(page)
            t_join, joined = time.time(), 0
            if sockets:
                joined = sockets.wait_joined(300)
            for page in followers:
                try:
                    page.wait_for_selector("h1", timeout=max(1000, int(1000 * (t_join + 300 - time.time()))))  # 5 min for all
                    joined += 1
                except Exception:  # noqa: BLE001 - counted: a follower that never drew its page
                    errors.append("a follower's page did not draw within 5 minutes of joining")
            print(f"{joined} of {len(followers)} followers drew their page in {time.time() - t_join:.0f} s", flush=True)
            t_joined = time.time() - t_join
            warm_rss = rss[-1] if rss else None
            time.sleep(10)  # each follower's first heartbeat (its page once more, registered to be woken) is over
            idle_at = (time.time(), cpu_seconds())  # the class between moves: every follower's heartbeat, nothing else
            time.sleep(args.idle)
            idle = (time.time() - idle_at[0], cpu_seconds() - idle_at[1])
            cpu_at.append(cpu_seconds())
            t_moves = time.time()
            deadline = time.time() + 60 * args.minutes
            i = 0
            while time.time() < deadline:
                i += 1
                slug, prompt = STEPS[i % len(STEPS)]
                if changes:  # the presenter's own page and prompt, one interval after its last change
                    now = (
                        teacher.evaluate("location.pathname").rsplit("/", 1)[-1]
                        + "|"
                        + teacher.locator("[data-testid='stSidebar'] textarea").first.input_value()
                    )
                    if now != changes[-1][0].lstrip("/"):
                        presenter_off.append({"change": changes[-1][0], "presenter_then": now})
                same_page = teacher.evaluate("location.pathname").endswith("/" + slug)  # page.url misses the nav's pushState
                t0 = time.time() * 1000  # the presenter's action that completes the change: the new prompt, or the click
                if prompt != teacher.locator("[data-testid='stSidebar'] textarea").first.input_value():
                    set_prompt(teacher, prompt)
                if not same_page:
                    t0 = time.time() * 1000
                    teacher.locator(f"[data-testid='stSidebarNavLink'][href$='/{slug}']").first.click()
                changes.append((f"/{slug}|{prompt}", t0))
                print(f"change {i}: {slug} | {prompt}", flush=True)
                time.sleep(args.every)
            cpu_at.append(cpu_seconds())
            t_moves = time.time() - t_moves
            for page in followers:
                for e in page.locator("[data-testid='stException']").all_inner_texts():
                    errors.append(e[:200])
            seen = [page.evaluate("() => window.__seen") for page in followers]
            if sockets:
                seen, _ = sockets.close(), errors.extend(sockets.errors)
            b.close()
    finally:
        stop.set()
        end_rss = rss[-1] if rss else None
        stop_server(proc)
    lines = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    drawn = [x["delay_s"] for x in lines if "delay_s" in x]
    published = [(f"/{x['slug']}|{x['prompt']}", x["published"] * 1000) for x in lines if "published" in x]
    delays, missed, missed_which, first_follower, presenter, after_publish = [], 0, [], [], [], []
    for k, (want, t0) in enumerate(changes):
        t_next = changes[k + 1][1] if k + 1 < len(changes) else float("inf")
        # when the presenter's run published this view (its browser and its run: not the server's delivery)
        pub = next((t for label, t in published if label == want and t0 <= t < t_next), None)
        if pub is not None:
            presenter.append((pub - t0) / 1000)
        for j, log in enumerate(seen):
            # shown after the change and before the next one (a later step that returns to the same view is not this one)
            hit = next((t for path, t in log if path.endswith(want) and t0 <= t < t_next), None)  # pathname may carry a base
            if j == 0:
                first_follower.append({"change": want, "delay_s": None if hit is None else round((hit - t0) / 1000, 2)})
            if hit is None:
                missed += 1
                missed_which.append({"change": want, "follower_then": [p for p, t in log if t < t0][-1:]})
            else:
                delays.append((hit - t0) / 1000)
                if pub is not None:
                    after_publish.append((hit - pub) / 1000)
    store_ms = _store_probe(state, args.store) if args.replicas > 1 or not args.store else None
    write(
        args.out,
        {
            "followers": args.followers,
            "processes": args.replicas,
            "balancer": "HAProxy (hosting/launch.py)" if args.replicas > 1 else None,
            "server_cpu_ms_per_student_per_move": (
                round(1000 * (cpu_at[1] - cpu_at[0]) / max(1, args.followers * len(changes)), 1) if len(cpu_at) == 2 else None
            ),
            "server_cpu_ms_per_student_per_move_what": "CPU seconds of every server process (apps, balancer) over the moves, over followers x moves (the presenter's and the heartbeats' share included)",
            "server_cpu_ms_per_student_per_s_idle": round(1000 * idle[1] / idle[0] / max(1, args.followers), 2),
            "server_cpu_ms_per_student_per_s_idle_what": f"the same between moves ({args.idle:.0f} s after joining, no move): what following costs the server with nothing new to show (the heartbeats)",
            "server_cpu_ms_per_student_per_move_beyond_idle": (
                round(1000 * (cpu_at[1] - cpu_at[0] - idle[1] / idle[0] * t_moves) / max(1, args.followers * len(changes)), 1) if len(cpu_at) == 2 else None
            ),
            "store_us": store_ms,
            "followers_draw_figures": args.draw,
            "followers_kind": "websocket clients (bench/socket_follower.py)" if args.sockets else "Chromium pages",
            "wake": "public: each follower's st.fragment(run_every=1s) heartbeat (LLM_EXPLORER_LIVE_WAKE=0)"
            if args.public_wake
            else "the watcher wakes each follower's session (views.live_wake, private runtime)",
            "server_nice": args.server_nice,
            "followers_joined": joined,
            "join_s": round(t_joined, 1),
            "minutes": args.minutes,
            "changes": len(changes),
            # the presenter's run publishes as it starts and after its page: a second publish (and wake-up) only where
            # the page's own widgets changed the view
            "publishes": len(published),
            "delay_s": {"p50": pct(delays, 50), "p95": pct(delays, 95), "max": max(delays) if delays else None, "n": len(delays)},
            "presenter_s": {
                "what": "from the presenter's action (the bench's typing or click in its Chromium) to its run publishing the view",
                "p50": pct(presenter, 50),
                "p95": pct(presenter, 95),
                "max": max(presenter) if presenter else None,
                "n": len(presenter),
            },
            "after_publish_s": {
                "what": "from the presenter's run publishing the view to the change in each follower's address (the server's delivery)",
                "p50": pct(after_publish, 50),
                "p95": pct(after_publish, 95),
                "max": max(after_publish) if after_publish else None,
                "n": len(after_publish),
            },
            "server_delay_s": {
                "what": "from the presenter's run publishing a view to a follower's run drawing it to its end, on the server (before the browser renders)",
                "p50": pct(drawn, 50),
                "p95": pct(drawn, 95),
                "max": max(drawn) if drawn else None,
                "n": len(drawn),
            },
            "goal_p95_s": 3.0,
            "missed": missed,
            "missed_examples": missed_which[:5],
            "presenter_off": presenter_off[:10],  # the presenter's own page or prompt not what it set (should be none)
            "first_follower": first_follower,
            "errors": errors[:20],
            "server_cpu_percent_of_one_core": {"mean": round(statistics.mean(cpu), 1) if cpu else None, "peak": max(cpu) if cpu else None},
            "machine_cpu_percent_of_one_core": {
                "what": f"every process on the {psutil.cpu_count()}-core machine (100 = one core busy)",
                "mean": round(statistics.mean(machine), 1) if machine else None,
                "peak": round(max(machine), 1) if machine else None,
            },
            "browsers_cpu_percent_of_one_core": {
                "mean": round(statistics.mean(browsers), 1) if browsers else None,
                "peak": round(max(browsers), 1) if browsers else None,
            },
            "server_rss_mb": {"after_warm_up": round(warm_rss / 2**20) if warm_rss else None, "end": round(end_rss / 2**20) if end_rss else None},
        },
    )


def _store_probe(state: str, store: str) -> dict | None:
    """The store's own time, from this process on the bench's SQLite file: microseconds per operation (median of 200)
    for what a follower's heartbeat and the watchers do: the change number, a class's record, a heartbeat's write."""
    import os

    if store:
        return None
    os.environ["LLM_EXPLORER_STATE_DIR"] = state
    from hosting.store import open_store

    s = open_store(None)
    out = {}
    for name, fn in (
        ("number (a watcher's look)", lambda: s.number("classes")),
        ("get (a heartbeat's read of the class)", lambda: s.get("classes", "x")),
        ("put (a heartbeat's write)", lambda: s.put("bench", "x", b"{}", ttl_s=60)),
    ):
        ts = []
        for _ in range(200):
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        out[name] = round(statistics.median(ts) * 1e6, 1)
    return out


if __name__ == "__main__":
    main()
