"""Helpers for driving the app in headless Chromium (imported by the browser tests)."""

import collections
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = "/usr/bin/chromium"
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(port: int, env: dict | None = None, cwd: Path | None = None):
    """A fresh `streamlit run app.py` on 127.0.0.1:port; returns (process, url) once it answers its health check.
    `cwd`: the folder it runs in (its .streamlit/secrets.toml is the operator's file; default the project). Each server
    has a store of its own (a fresh state folder) unless `env` names one (LLM_EXPLORER_STATE_DIR or LLM_EXPLORER_STORE):
    a restart test passes the same one to both starts."""
    env = dict(env or {})
    if "LLM_EXPLORER_STATE_DIR" not in env and "LLM_EXPLORER_STORE" not in env:
        env["LLM_EXPLORER_STATE_DIR"] = tempfile.mkdtemp(prefix="llmx-server-")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "streamlit",
            "run",
            str(ROOT / "app.py"),
            "--server.port",
            str(port),
            "--server.address",
            "127.0.0.1",
            "--server.headless",
            "true",
            "--browser.gatherUsageStats",
            "false",
        ],
        cwd=cwd or ROOT,
        env=dict(os.environ, **(env or {})),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    # the server's output drained as it comes (the last 400 lines kept for a failure's message): a pipe nobody read
    # filled at 64 KB of log lines, and every thread of the server that logged then blocked on the write (a live
    # class of 30 froze for half an hour; a student once took over 60 s to follow in CI)
    proc.tail = collections.deque(maxlen=400)
    threading.Thread(target=lambda: [proc.tail.append(line) for line in iter(proc.stdout.readline, b"")], daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    for _ in range(240):
        try:
            urllib.request.urlopen(url + "/_stcore/health", timeout=1)
            return proc, url
        except Exception:
            if proc.poll() is not None:
                break
            time.sleep(0.5)
    proc.kill()
    proc.wait(10)
    time.sleep(0.2)  # the drain's last lines
    raise RuntimeError(b"".join(proc.tail).decode(errors="replace")[-3000:])


def stop_server(proc):
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def wait_idle(page, timeout=180_000):
    """Wait until Streamlit has finished the script run: no running status, no spinner, no progress bar,
    no stale (greyed) element, twice in a row."""
    js = """() => { const app = document.querySelector('[data-testid="stApp"]');
                 const state = app ? app.getAttribute('data-test-script-state') : 'initial';
                 return state !== 'running' && state !== 'initial' && state !== 'rerunRequested'
                 && !document.querySelector('[data-testid="stSpinner"]')
                 && !document.querySelector('[data-testid="stCacheSpinner"]')
                 && !document.querySelector('[data-testid="stProgress"]')
                 && !document.querySelector('[data-stale="true"]'); }"""
    for _ in range(2):
        page.wait_for_timeout(500)
        page.wait_for_function(js, timeout=timeout)


def settled(page, timeout=60_000):
    """Wait until the page has drawn what it shows: web fonts loaded and every Plotly figure rendered to SVG (a
    screenshot or a scan of the page's elements reads the drawn page, never a clock)."""
    page.wait_for_function(
        "() => document.fonts.status === 'loaded'"
        " && [...document.querySelectorAll('.js-plotly-plot')].every(p => p.querySelector('.main-svg') && p._fullLayout)",
        timeout=timeout,
    )


def no_exception(page):
    assert page.locator("[data-testid='stException']").count() == 0, page.locator("[data-testid='stException']").first.inner_text()


def set_prompt(page, text):
    box = page.locator("[data-testid='stSidebar'] textarea").first
    box.fill(text)
    box.press("Control+Enter")
    wait_idle(page)


def open_app(server, browser, height=2000):
    """A fresh session on the overview page, idle."""
    page = browser.new_page(viewport={"width": 1400, "height": height})
    page.goto(server, wait_until="domcontentloaded")
    page.wait_for_selector("h1", timeout=240_000)
    wait_idle(page, 300_000)
    return page


def click_button(page, text, timeout=180_000, expect=None):
    """Click a button and wait for the run it starts: first for the script to start (on a loaded CI machine the
    rerun can begin more than a second after the click, and an idle check alone would pass before it), then
    for it to finish. With `expect` (a selector the run draws), a click whose run left nothing is tried again,
    twice at most: on a loaded machine the engine panel's 2-second refresh makes the page look running and idle
    in turns, and an idle gap between its refresh and the button's run would end the wait too early."""
    started = """() => { const app = document.querySelector('[data-testid="stApp"]');
                 const state = app ? app.getAttribute('data-test-script-state') : 'initial';
                 return state === 'running' || state === 'rerunRequested' || !!document.querySelector('[data-stale="true"]'); }"""
    for _ in range(3):
        page.get_by_role("button", name=text).first.click()
        try:
            page.wait_for_function(started, timeout=30_000, polling=20)
        except Exception:  # noqa: BLE001 - a run shorter than the polling interval: the idle check below settles it
            pass
        wait_idle(page, timeout)
        if expect is None:
            return
        try:
            page.wait_for_selector(expect, timeout=10_000)
            return
        except Exception:  # noqa: BLE001 - nothing drawn yet: the run may still be coming, or the click was lost
            wait_idle(page, timeout)
            if page.locator(expect).count():
                return
    alerts = page.locator("[data-testid='stAlert']").all_inner_texts()
    raise AssertionError(f"{text!r} drew no {expect!r} after three clicks; the page says: {alerts}")


def visit(browser, url, width=1300, height=1400, outside=None):
    """A new browser (a context of its own: its own cookies, as another visitor's) on `url`, idle. `outside`, a
    list, collects every request the page makes to anything but the app's own server."""
    page = browser.new_page(viewport={"width": width, "height": height})
    if outside is not None:
        origin = url.split("/", 3)[:3]
        page.on("request", lambda r: None if r.url.split("/", 3)[:3] == origin or r.url.startswith(("data:", "blob:")) else outside.append(r.url))
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector("h1", timeout=240_000)
    wait_idle(page, 300_000)
    return page


def fresh(browser, url, opened=None, cookies=None):
    """A new browser (its own cookies; `cookies`, {name: value}, set for `url`'s host first) on `url`, idle; its context
    added to `opened` (closed by the test's fixture)."""
    from urllib.parse import urlsplit

    ctx = browser.new_context(viewport={"width": 1300, "height": 1000})
    u = urlsplit(url)
    ctx.add_cookies([{"name": k, "value": v, "url": f"{u.scheme}://{u.netloc}/"} for k, v in (cookies or {}).items()])
    if opened is not None:
        opened.append(ctx)
    page = ctx.new_page()
    page.goto(url, wait_until="domcontentloaded", timeout=240_000)
    page.wait_for_selector("h1", timeout=240_000)
    wait_idle(page, 300_000)
    return page
