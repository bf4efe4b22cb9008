"""A live class no one else can take over or end, in real Chromium on a demo server (each browser its own context, so
its own cookie; every one of them at the same client address, as a class behind one NAT is):

- the presenter opens an address carrying `_sid=`, `_live_*` and an unknown key: the follower keeps its own browser id
  (its cookie), never gets the presenter's controls, and its address carries none of them;
- the presenter's tab, open but idle past the class's idle time, keeps the class;
- the teacher hides an answer from the projected chart;
- strangers starting classes at the server's limit are refused with a clear message, and the teacher's class runs on;
- the operator page lists the running classes and ends one (its students are told);
- a code that ended reads, to a newcomer, as one that never existed; a flood of wrong codes from one browser is refused.

The server: at most 2 classes (LLM_EXPLORER_MAX_CLASSES), 3 starts an hour per address (classes_per_hour), 8 runs a
minute per browser, an idle class ends after 0.75 minutes (45 s) without its presenter's heartbeat."""

import re
import secrets

import pytest
from playwright.sync_api import expect
from ui import ROOT, free_port, start_server, stop_server, wait_idle

pytestmark = pytest.mark.browser
SOON = 120_000
IDLE_MIN = 0.75  # 45 s: a presenter's page run on a loaded CI machine can take tens of seconds, with no beat meanwhile
PASSWORD = "op-" + secrets.token_hex(4)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("live-trust")
    (cwd / ".streamlit").mkdir()
    (cwd / ".streamlit" / "config.toml").write_text((ROOT / ".streamlit" / "config.toml").read_text())
    (cwd / ".streamlit" / "secrets.toml").write_text(
        f'[demo]\nenabled = true\nrequests_per_minute = 8\nclasses_per_hour = 3\noperator_password = "{PASSWORD}"\n'
    )
    proc, url = start_server(free_port(), cwd=cwd, env={"LLM_EXPLORER_MAX_CLASSES": "2", "LLM_EXPLORER_CLASS_IDLE_MIN": str(IDLE_MIN)})
    yield url
    stop_server(proc)


def fresh(browser, url, opened):
    """A new browser (its own cookies) on `url`, idle."""
    ctx = browser.new_context(viewport={"width": 1300, "height": 1000})
    opened.append(ctx)
    page = ctx.new_page()
    goto(page, url)
    return page


def goto(page, url):
    page.goto(url, wait_until="domcontentloaded", timeout=240_000)
    page.wait_for_selector("h1", timeout=240_000)
    wait_idle(page, 300_000)


def at(page, slug):
    page.wait_for_function(f"() => location.pathname.endsWith('/{slug}')", timeout=SOON)


def browser_id(page) -> str:
    return next((c["value"] for c in page.context.cookies() if c["name"] == "llm_explorer_browser"), "")


def start_class(page) -> str:
    """Start a live class in this browser; its join link."""
    page.get_by_role("button", name="Start a live class").click()
    wait_idle(page)
    page.get_by_role("button", name=re.compile("Live class ")).first.click()
    body = page.locator("[data-testid='stPopoverBody']")
    link = body.locator("code").first.inner_text().strip()
    page.keyboard.press("Escape")
    return link


def text(page) -> str:
    return page.locator("body").inner_text()


def test_a_class_no_one_else_can_take_over_or_end(server, browser, opened):
    teacher = fresh(browser, f"{server}/tokens", opened)
    link = start_class(teacher)
    code = link.split("follow=")[1]
    teacher_id = browser_id(teacher)
    student = fresh(browser, link, opened)
    at(student, "tokens")
    student_id = browser_id(student)
    assert re.fullmatch(r"[0-9a-f]{16}", student_id) and student_id != teacher_id

    # the presenter opens a link carrying a browser id, a live-class key and an unknown key: the class follows the
    # view, the student keeps its own identity and never becomes a presenter
    goto(teacher, f"{server}/attention?_sid={student_id}&_live_code=zzzzzzzz&_live_exploring=true&zz=evil&prompt=Dog+bites+man.")
    expect(teacher.get_by_role("button", name=re.compile("Live class ")).first).to_be_visible()  # the same class
    at(student, "attention")
    box = student.locator("[data-testid='stSidebar'] textarea").first
    expect(box).to_have_value("Dog bites man.", timeout=SOON)
    expect(box).to_be_disabled()  # the presenter's prompt, shown while following, not editable
    student.wait_for_timeout(2000)
    assert browser_id(student) == student_id, "the follower keeps its own browser id"
    for leak in ("_sid", "_live", "zz="):
        assert leak not in student.url, (leak, student.url)
    assert student.get_by_role("button", name=re.compile("End the class|Live class|Start a live class")).count() == 0
    student.get_by_role("button", name="Explore on my own").click()
    wait_idle(student)
    assert browser_id(student) == student_id
    # on its own the student may start a class of its own, never see or end the teacher's
    student.get_by_role("button", name="Follow again").click()
    wait_idle(student)
    at(student, "attention")

    # the teacher talks, not clicking, for longer than the idle time: the open tab keeps the class
    teacher.wait_for_timeout(IDLE_MIN * 60_000 + 12_000)
    assert "ended" not in text(student) and "no live class" not in text(student)
    teacher.locator("[data-testid='stSidebarNavLink'][href$='/next-token']").first.click()
    wait_idle(teacher)
    at(student, "next-token")

    # "what comes next?": a rude typed answer, hidden from the projected chart by the teacher
    teacher.get_by_role("button", name="Ask the class what comes next").click()
    wait_idle(teacher)
    student.wait_for_function("() => /Send my guess|ended|no live class/.test(document.body.innerText)", timeout=SOON)
    assert student.get_by_role("button", name="Send my guess").count(), student.locator("[data-testid='stAlert']").all_inner_texts()
    student.locator(".st-key-live_type_1 input").fill("rude word")
    student.get_by_role("button", name="Send my guess").click()
    wait_idle(student)
    chart = teacher.locator(".js-plotly-plot text", has_text="rude word")
    expect(chart.first).to_be_visible(timeout=SOON)
    teacher.locator(".st-key-live_hidden button", has_text="rude word").click()
    expect(chart).to_have_count(0, timeout=SOON)
    expect(teacher.locator("[data-testid='stMetricValue']", has_text=re.compile(r"^1$")).first).to_be_visible()  # still counted

    # strangers start classes: the second fits the server's limit of 2, the third is refused for it, the fourth by the
    # address's 3 starts an hour; the teacher's class runs on
    refusals = []
    for _ in range(3):
        s = fresh(browser, f"{server}/tokens", opened)
        s.get_by_role("button", name="Start a live class").click()
        wait_idle(s)
        refusals.append(" ".join(s.locator("[data-testid='stAlert']").all_inner_texts()))
    assert refusals[0] == "" or "Refused" not in refusals[0], refusals[0]
    assert "2 live classes already" in refusals[1] and "no class was started" in refusals[1], refusals[1]
    assert "3 live classes an hour" in refusals[2], refusals[2]
    assert "ended" not in text(student)
    teacher.locator("[data-testid='stSidebarNavLink'][href$='/layer']").first.click()
    wait_idle(teacher)
    at(student, "layer")

    # the operator lists both classes and ends the teacher's: the student is told
    op = fresh(browser, f"{server}/operator", opened)
    op.locator("input[type='password']").fill(PASSWORD)
    op.locator("input[type='password']").press("Enter")
    op.get_by_text(re.compile(r"Live classes \(2 of at most 2\)")).wait_for(timeout=SOON)
    op.locator(".st-key-op_class input").fill(code)
    op.locator(".st-key-op_class input").press("Enter")
    wait_idle(op)
    op.get_by_role("button", name="End this class").click()
    wait_idle(op)
    student.wait_for_function('() => document.body.innerText.includes("the server\'s operator closed it")', timeout=SOON)
    assert "follow=" not in student.url
    teacher.get_by_role("button", name="Start a live class").wait_for(timeout=SOON)
    # a newcomer with the ended class's code reads what a code that never existed reads
    late = fresh(browser, link, opened)
    late.wait_for_function("() => document.body.innerText.includes('no live class with the code')", timeout=SOON)
    assert "closed" not in text(late) and "ended" not in text(late)


def test_a_flood_of_wrong_codes_is_refused(server, browser, opened):
    alphabet = "23456789abcdefghjkmnpqrstuvwxyz"
    page = fresh(browser, f"{server}/tokens", opened)
    said = []
    for _ in range(12):  # 8 runs a minute per browser: each wrong code tried is one (the tokens page: a quick page)
        page.goto(f"{server}/tokens?follow={''.join(secrets.choice(alphabet) for _ in range(8))}", wait_until="domcontentloaded")
        page.wait_for_function("() => /no live class with the code|Refused/.test(document.body.innerText)", timeout=SOON)
        said.append(" ".join(page.locator("[data-testid='stAlert']").all_inner_texts()))
        if "Refused" in said[-1]:
            break
    assert all("no live class with the code" in s for s in said[:-1]) and len(said) >= 6, said
    assert "Refused: too many runs from this browser" in said[-1], said
    assert "follow=" not in page.url
