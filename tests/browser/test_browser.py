"""The whole app in a real headless Chromium (Debian's /usr/bin/chromium driven by Playwright).

Opens every page, types a prompt, moves the temperature slider and checks the bars changed, generates 20
tokens, and saves screenshots (to docs/screenshots/, which the README shows, with `make screenshots`)."""

import os
import re

import pytest
from ui import ROOT, click_button, no_exception, open_app, set_prompt, settled, wait_idle

pytestmark = pytest.mark.browser

# `make screenshots` refreshes the README's pictures; a plain test run writes to artifacts/ (ignored by git)
SHOTS = ROOT / ("docs" if os.environ.get("SAVE_DOCS_SCREENSHOTS") else "artifacts") / "screenshots"
PAGES = [("", "overview"), ("tokens", "tokens"), ("embeddings", "embeddings"), ("attention", "attention"), ("layer", "layer"), ("next-token", "next-token")]


def test_every_page_and_the_temperature_slider(server, browser):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 2200})  # tall: one screenshot per stage
    page.goto(server, wait_until="domcontentloaded")
    page.wait_for_selector("h1", timeout=240_000)
    wait_idle(page, 300_000)
    set_prompt(page, "Why is the sky blue?")
    no_exception(page)
    for path, name in PAGES:
        # click the sidebar link (a new page.goto would start a new session and forget the prompt)
        page.locator(f"[data-testid='stSidebarNavLink'][href$='/{path}']").first.click()
        wait_idle(page)
        assert page.locator("[data-testid='stSidebar'] textarea").first.input_value() == "Why is the sky blue?"
        no_exception(page)
        assert page.locator(".js-plotly-plot, [data-testid='stHtml'], [data-testid='stImage']").count() > 0, name
        settled(page)
        page.screenshot(path=str(SHOTS / f"{name}.png"))

    # bertviz inside its iframe draws SVG offline
    page.locator("[data-testid='stSidebarNavLink'][href$='/attention']").first.click()
    wait_idle(page)
    frame = page.frame_locator("iframe").first
    frame.locator("svg text").first.wait_for(timeout=60_000)
    assert frame.locator("svg text").count() > 5
    page.locator("[data-testid='stSidebarNavLink'][href$='/next-token']").first.click()
    wait_idle(page)

    # the next-token page: move the temperature slider and check the bars changed
    page.set_viewport_size({"width": 1400, "height": 1000})
    page.wait_for_selector(".js-plotly-plot", timeout=120_000)
    wait_idle(page)

    def bar_texts():
        return page.eval_on_selector_all(".js-plotly-plot .bartext", "els => els.map(e => e.textContent)")

    before = bar_texts()
    assert before, "the sampling chart has bars"
    track = page.locator(".st-key-temperature [data-testid='stSlider'] [role='group'] > div").first
    box = track.bounding_box()
    page.mouse.click(box["x"] + 0.25 * box["width"], box["y"] + box["height"] / 2)  # 1.0 -> about 0.5
    wait_idle(page)
    after = bar_texts()
    value = page.locator(".st-key-temperature [data-testid='stSliderThumbValue']").first.inner_text()
    assert float(value) < 0.8, value
    assert after and after != before
    no_exception(page)
    page.screenshot(path=str(SHOTS / "next-token-t05.png"), full_page=False)


def test_bad_input_keeps_serving(server, browser):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    page.goto(f"{server}/tokens", wait_until="domcontentloaded")
    page.wait_for_selector("h1", timeout=240_000)
    wait_idle(page, 300_000)
    set_prompt(page, "   ")
    assert "empty" in page.locator("[data-testid='stAlert']").first.inner_text()
    set_prompt(page, "NUL\x00 and bell\x07 and <|im_end|> typed by hand")
    no_exception(page)
    set_prompt(page, "Dog bites man.")
    assert page.locator("[data-testid='stAlert']").count() == 0 or "empty" not in page.locator("[data-testid='stAlert']").first.inner_text()
    no_exception(page)


@pytest.mark.load  # runs every experiment of these pages in Chromium (minutes): make test-load; AppTest runs them in make test
def test_generation_pages(server, browser):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = open_app(server, browser)
    set_prompt(page, "Why is the sky blue?")
    page.locator("[data-testid='stSidebarNavLink'][href$='/generation']").first.click()
    wait_idle(page)
    click_button(page, "Why is the sky blue?")  # the preset that generates well: this prompt in chat mode
    n = page.locator(".st-key-gen_n input").first
    n.fill("20")
    n.press("Enter")
    wait_idle(page)
    click_button(page, "Generate")
    no_exception(page)
    assert page.locator("[data-testid='stMetricValue']").first.inner_text() == "20"
    page.screenshot(path=str(SHOTS / "generation.png"))
    for path, button in [("prefill-decode", "Run the sweep"), ("kv-cache", None), ("hardware", "Run with telemetry")]:
        page.locator(f"[data-testid='stSidebarNavLink'][href$='/{path}']").first.click()
        wait_idle(page)
        if button:
            click_button(page, button)
        if path == "hardware":
            click_button(page, "Measure")
        no_exception(page)
        assert page.locator(".js-plotly-plot").count() > 0, path
        page.screenshot(path=str(SHOTS / f"{path}.png"))


@pytest.mark.load  # runs every experiment of these pages in Chromium (minutes): make test-load; AppTest runs them in make test
def test_faster_inference_pages(server, browser):
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = open_app(server, browser)
    # the kernel, production and speculative runs are checked in AppTest (tests/views); here every page renders in a
    # real browser and two runs draw their figures; `make screenshots` presses every button for the README's pictures
    docs = bool(os.environ.get("SAVE_DOCS_SCREENSHOTS"))
    for path, button, params in [
        ("roofline", "Measure", ""),
        ("attention-kernels", "Run the kernels" if docs else None, ""),
        ("production", "Run all modes" if docs else None, "prod_n=16"),  # 5 interleaved repeats of each mode: short ones
        ("speculative", "Run plain and speculative" if docs else None, "spec_n=16"),
        ("streaming-sharding", None, ""),
        ("batching", "Run the three policies", ""),
    ]:
        page.goto(f"{server}/{path}?{params}", wait_until="domcontentloaded")
        page.wait_for_selector("h1", timeout=240_000)
        wait_idle(page, 300_000)
        drawn = ".js-plotly-plot, [data-testid='stHtml'], [data-testid='stCode']"
        if button:
            click_button(page, button, 600_000, expect=drawn)
        no_exception(page)
        if button or path == "streaming-sharding":
            assert page.locator(drawn).count() > 0, path
        else:
            assert page.get_by_role("button", name=re.compile("^Run")).count() > 0, path
        page.screenshot(path=str(SHOTS / f"{path}.png"))
