"""Every page on an 8,000-token prompt in a real Chromium (issue 56): the trace runs at the forward's speed and the
maps are computed when a page asks, so no page fails, every chart is drawn, no figure is heavier than a few MB, and
each page is saved as a screenshot (artifacts/screenshots/long-*.png) to look at."""

import sys

import pytest
from ui import ROOT, no_exception, set_prompt, settled, wait_idle

pytestmark = pytest.mark.browser

SHOTS = ROOT / "artifacts" / "screenshots"
MAX_FIGURE_CHARS = 4_000_000  # a figure's data and layout as JSON: a tab stays responsive
# its size as sent (Plotly's JSON, arrays as base64): the drawn figure holds its arrays decoded (typed arrays)
FIGURE_CHARS = """els => els.map(e => { let bytes = 0;
  const s = JSON.stringify([e.data, e.layout], (k, v) => { if (ArrayBuffer.isView(v)) { bytes += v.byteLength * 4 / 3; return 0; } return v; });
  return s.length + bytes; })"""


def test_every_page_on_an_8000_token_prompt(server, browser):
    sys.path.insert(0, str(ROOT / "bench"))
    from bench_long_trace import prose
    from transformers import AutoTokenizer

    from pipeline.model.store import cached_folder
    from views.pages import ALL

    text = prose(AutoTokenizer.from_pretrained(cached_folder("smollm2-135m-instruct")), 8000)
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1600})
    page.goto(server, wait_until="domcontentloaded")
    page.wait_for_selector("h1", timeout=240_000)
    wait_idle(page, 300_000)
    page.locator("[data-testid='stSidebar'] textarea").first.fill(text)
    page.locator("[data-testid='stSidebar'] textarea").first.press("Control+Enter")
    wait_idle(page, 600_000)
    no_exception(page)
    assert "8,0" in page.locator("[data-testid='stSidebar']").inner_text()  # "This run: 8,0xx tokens"
    for spec in [s for s in ALL if not s.hidden]:
        page.locator(f"[data-testid='stSidebarNavLink'][href$='/{spec.slug}']").first.click()
        wait_idle(page, 600_000)
        no_exception(page)
        settled(page, 120_000)  # every Plotly figure drawn
        sizes = page.eval_on_selector_all(".js-plotly-plot", FIGURE_CHARS)
        assert all(n < MAX_FIGURE_CHARS for n in sizes), (spec.slug, sizes)
        page.screenshot(path=str(SHOTS / f"long-{spec.slug or 'overview'}.png"))
    set_prompt(page, "Why is the sky blue?")  # and the server goes on serving a short one
    no_exception(page)
