"""The decode steps (issue 57) in real Chromium: the presenter records the generation page's decode steps and steps
through them (Next step, the layer); a student following the live class sees the same step (its cache length, token
and figure), recorded on the student's process from the view alone; the section in presentation mode. Screenshots
under artifacts/screenshots/steps-*.png."""

from pathlib import Path

import pytest
from ui import fresh, no_exception, set_prompt, settled, wait_idle

pytestmark = pytest.mark.browser
SOON = 120_000
SHOTS = Path(__file__).resolve().parents[2] / "artifacts" / "screenshots"


def metric(page, label: str) -> str:
    box = page.locator("[data-testid='stMetric']", has_text=label).first
    return box.locator("[data-testid='stMetricValue']").inner_text().strip()


def step_of(page) -> str:
    return page.locator(".st-key-steps_step [data-testid='stSliderThumbValue']").first.inner_text().strip()


def test_a_follower_sees_the_presenters_decode_step(server, browser, opened):
    teacher = fresh(browser, f"{server}/generation", opened)
    set_prompt(teacher, "The capital of France is")
    teacher.get_by_role("button", name="Start a live class").click()
    wait_idle(teacher)
    teacher.get_by_role("button", name="Live class").first.click()
    body = teacher.locator("[data-testid='stPopoverBody']")
    link = body.locator("code").first.inner_text().strip()
    teacher.keyboard.press("Escape")
    student = fresh(browser, link, opened)
    student.wait_for_function("() => location.pathname.endsWith('/generation')", timeout=SOON)

    teacher.locator(".st-key-steps_on").get_by_text("Record the decode steps").click()
    wait_idle(teacher)
    teacher.locator(".st-key-steps_step").wait_for(timeout=SOON)
    for _ in range(3):
        teacher.get_by_role("button", name="Next step").click()
        wait_idle(teacher)
    assert step_of(teacher) == "3"
    keys = metric(teacher, "Keys in the cache")
    token = metric(teacher, "Token chosen")
    assert int(keys) == int(metric(teacher, "Keys in the cache"))
    no_exception(teacher)

    # the student: the same step, drawn from a recording made on the student's side from the view alone
    student.locator(".st-key-steps_step").wait_for(timeout=SOON)
    student.wait_for_function(
        "(k) => [...document.querySelectorAll('[data-testid=stMetric]')].some(m => m.innerText.includes('Keys in the cache') && m.innerText.includes(k))",
        arg=keys,
        timeout=SOON,
    )
    wait_idle(student)
    assert step_of(student) == "3" and metric(student, "Token chosen") == token
    no_exception(student)
    settled(student)
    assert student.locator(".js-plotly-plot", has_text="head 0").count() >= 1  # the heads' rows drawn

    SHOTS.mkdir(parents=True, exist_ok=True)
    # play walks the steps on its own (one every 1.5 s), and the follower walks with it
    teacher.locator(".st-key-steps_play").get_by_text("Play").click()
    teacher.wait_for_function("() => document.querySelector('.st-key-steps_step [data-testid=stSliderThumbValue]')?.innerText.trim() === '5'", timeout=SOON)
    teacher.locator(".st-key-steps_play").get_by_text("Play").click()
    wait_idle(teacher)
    student.wait_for_function(
        "(s) => document.querySelector('.st-key-steps_step [data-testid=stSliderThumbValue]')?.innerText.trim() === s", arg=step_of(teacher), timeout=SOON
    )
    for name, page in (("presenter", teacher), ("follower", student)):
        page.locator(".st-key-steps_step").scroll_into_view_if_needed()
        settled(page)
        page.screenshot(path=str(SHOTS / f"steps-{name}.png"))
    teacher.get_by_text("Presentation mode").click()
    wait_idle(teacher)
    teacher.locator(".st-key-steps_step").scroll_into_view_if_needed()
    settled(teacher)
    no_exception(teacher)
    teacher.screenshot(path=str(SHOTS / "steps-presentation.png"))
