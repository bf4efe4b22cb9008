"""A lecture hall in real Chromium: two app processes behind HAProxy (hosting/launch.py), the presenter's browser held on
one process and a student's on the other by the balancer's cookie. The class started on one is followed from the
other; then every process is stopped and started again (on the SQLite file, and on a redis-server of the launcher's
own): the long prompt's ?p= link, the frozen ?view= link, the presenter's saved run and the live class are all there,
the presenter still owns it and the student follows again. Skipped with the reason where HAProxy (or redis-server)
is not installed; .ci/run installs both."""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
from ui import free_port, fresh, set_prompt, wait_idle

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]
SOON = 120_000
DEFAULT = "The capital of France is"  # views.sidebar.DEFAULTS["prompt"]
LONG = "Why is the sky blue? " * 120  # 2,520 characters: too long for a link, kept in the store (?p=)


def start_hall(port: int, state: str, store: str):
    env = dict(os.environ, LLM_EXPLORER_STATE_DIR=state)
    env.pop("LLM_EXPLORER_STORE", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hosting.launch", "--replicas", "2", "--port", str(port), "--address", "127.0.0.1", "--store", store],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=1)
            return proc
        except Exception:  # noqa: BLE001
            if proc.poll() is not None:
                raise RuntimeError(f"the launcher exited: see {state}/hall-{port}/") from None
            time.sleep(0.5)
    raise RuntimeError("the hall did not answer in 5 minutes")


def stop_hall(proc):
    proc.send_signal(signal.SIGTERM)  # the launcher stops its app processes, HAProxy and its redis-server
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


def on(browser, url, app, opened):
    """A new browser held on app process `app` (the balancer's cookie, as after its first visit there)."""
    return fresh(browser, url, opened, cookies={"llmx_app": app})


def prompt_is(page, text, timeout=SOON):
    page.wait_for_function("t => document.querySelector('[data-testid=stSidebar] textarea')?.value === t", arg=text, timeout=timeout)


@pytest.mark.parametrize("store", ["", "redis"], ids=["sqlite", "redis"])
def test_a_class_across_two_processes_and_a_restart_that_loses_nothing(browser, opened, store):
    if shutil.which("haproxy") is None and not os.path.exists("/usr/sbin/haproxy"):
        pytest.skip("HAProxy is not installed (Debian: apt-get install haproxy; .ci/run installs it)")
    if store == "redis" and shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (Debian: apt-get install redis-server; .ci/run installs it)")
    port, state = free_port(), tempfile.mkdtemp(prefix="llmx-hall-")
    base = f"http://127.0.0.1:{port}"
    hall = start_hall(port, state, store)
    try:
        teacher = on(browser, f"{base}/next-token", "app1", opened)
        teacher.get_by_role("button", name="Sample").click()  # a saved run of the presenter's
        wait_idle(teacher)
        teacher.wait_for_function("() => document.body.innerText.includes(' drew ')", timeout=SOON)
        teacher.get_by_role("button", name="Share this view").click()
        teacher.get_by_role("button", name="Add a copy of my results to the link").click()
        wait_idle(teacher)
        view_link = teacher.locator("[data-testid='stPopoverBody'] code").filter(has_text="view=").first.inner_text().strip()
        teacher.keyboard.press("Escape")
        teacher.get_by_role("button", name="Start a live class").click()
        wait_idle(teacher)
        teacher.get_by_role("button", name="Live class").first.click()
        link = teacher.locator("[data-testid='stPopoverBody'] code").first.inner_text().strip()
        code = link.split("follow=")[1][:8]
        teacher.keyboard.press("Escape")
        student = on(browser, f"{base}/?follow={code}", "app2", opened)
        student.wait_for_function("() => location.pathname.endsWith('/next-token')", timeout=SOON)
        set_prompt(teacher, "Dog bites man.")
        wait_idle(teacher)
        prompt_is(student, "Dog bites man.")  # published on app1, seen on app2
        assert {c["name"]: c["value"] for c in student.context.cookies()}.get("llmx_app") == "app2"

        set_prompt(teacher, LONG)
        wait_idle(teacher)
        teacher.wait_for_function("() => new URL(location.href).searchParams.get('p')", timeout=SOON)
        p_link = teacher.url
        set_prompt(teacher, DEFAULT)
        wait_idle(teacher)

        stop_hall(hall)
        hall = start_hall(port, state, store)

        teacher.reload(wait_until="domcontentloaded")
        teacher.wait_for_selector("h1", timeout=240_000)
        wait_idle(teacher, 300_000)
        teacher.get_by_role("button", name=f"Live class {code}").wait_for(timeout=SOON)  # still the presenter's
        teacher.wait_for_function("() => document.body.innerText.includes(' drew ')", timeout=SOON)  # the saved run, back
        other = on(browser, p_link, "app2", opened)
        prompt_is(other, LONG)
        viewer = on(browser, view_link, "app1", opened)
        viewer.wait_for_function("() => document.body.innerText.includes(' drew ')", timeout=SOON)
        student.goto(f"{base}/?follow={code}", wait_until="domcontentloaded")  # the student rejoins with the code
        student.wait_for_selector("h1", timeout=240_000)
        set_prompt(teacher, "Dog bites man.")
        wait_idle(teacher)
        prompt_is(student, "Dog bites man.")
    finally:
        stop_hall(hall)


def test_a_process_killed_mid_class_leaves_the_class_running_and_its_students_reconnect(browser, opened):
    if shutil.which("haproxy") is None and not os.path.exists("/usr/sbin/haproxy"):
        pytest.skip("HAProxy is not installed (Debian: apt-get install haproxy; .ci/run installs it)")
    import psutil

    port, state = free_port(), tempfile.mkdtemp(prefix="llmx-hall-")
    base = f"http://127.0.0.1:{port}"
    hall = start_hall(port, state, "")
    try:
        teacher = on(browser, f"{base}/tokens", "app1", opened)
        teacher.get_by_role("button", name="Start a live class").click()
        wait_idle(teacher)
        teacher.get_by_role("button", name="Live class").first.click()
        code = teacher.locator("[data-testid='stPopoverBody'] code").first.inner_text().strip().split("follow=")[1][:8]
        teacher.keyboard.press("Escape")
        student = on(browser, f"{base}/?follow={code}", "app2", opened)
        student.wait_for_function("() => location.pathname.endsWith('/tokens')", timeout=SOON)
        app2 = next(p for p in psutil.Process(hall.pid).children() if p.environ().get("LLM_EXPLORER_PROCESS") == "app2")
        app2.kill()  # the student's process, mid-class
        set_prompt(teacher, "Dog bites man.")
        wait_idle(teacher)
        prompt_is(student, "Dog bites man.", timeout=180_000)  # its page reconnected to a live process and follows
        assert "follows the presenter" in student.locator("body").inner_text()
    finally:
        stop_hall(hall)
