"""Why this token in a real Chromium, on both models: the shares add up to the logit, the preset ablation switches the
largest heads off and shows the distribution move, and the Eiffel Tower / Colosseum patching preset draws its grid.
Screenshots go to artifacts/screenshots/ (docs/screenshots/ with `make screenshots`)."""

import os
from urllib.parse import quote

import pytest
from ui import ROOT, click_button, no_exception, settled, wait_idle

pytestmark = pytest.mark.browser

SHOTS = ROOT / ("docs" if os.environ.get("SAVE_DOCS_SCREENSHOTS") else "artifacts") / "screenshots"


def label(key: str) -> str | None:
    """The model picker's label (what a link carries), None when the model is not installed."""
    import pipeline

    return next((m.label for m in pipeline.available_models() if m.key == key and m.available), None)


@pytest.mark.parametrize("model", ["smollm2-135m-instruct", "gemma3-270m"])
def test_why_this_token_walks_attribution_ablation_and_patching(server, browser, model):
    if label(model) is None:
        pytest.skip(f"{model} not installed (make models)")
    SHOTS.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 4200})  # tall: the whole page in one screenshot
    page.goto(f"{server}/why?model_choice={quote(label(model))}&prompt={quote('The capital of France is')}", wait_until="domcontentloaded")
    page.wait_for_selector("h1", timeout=240_000)
    wait_idle(page, 300_000)
    no_exception(page)
    picked = page.locator("[data-testid='stSidebar'] [data-testid='stSelectbox']").first
    assert label(model) in (
        picked.locator("input").first.input_value()
        if picked.locator("input").count()
        else picked.evaluate("e => e.innerText + e.querySelector('[value]')?.value")
    )
    metrics = dict(zip(page.locator("[data-testid='stMetricLabel']").all_inner_texts(), page.locator("[data-testid='stMetricValue']").all_inner_texts()))
    logit = next((v for k, v in metrics.items() if k.startswith("The model's logit")), None)
    assert logit is not None, f"no logit metric; the page says: {page.locator('[data-testid=stMain]').inner_text()[:1500]}"
    assert abs(float(metrics["Sum of the shares"]) - float(logit)) < 2e-3, metrics
    settled(page)
    page.screenshot(path=str(SHOTS / f"why-{model}.png"))

    # clicking a head's cell in the shares heatmap opens that head's attention row below it
    heatmap = page.locator("[class*='st-key-main_figure'] .js-plotly-plot").first
    rows, cols = heatmap.evaluate("e => [e.data[0].y.length, e.data[0].x.length]")  # z travels as a typed array
    layer, head = rows // 2, 1
    area = heatmap.locator(".nsewdrag").first.bounding_box()
    page.mouse.click(area["x"] + (head + 0.5) * area["width"] / cols, area["y"] + (layer + 0.5) * area["height"] / rows)
    page.wait_for_selector(f".js-plotly-plot .gtitle:has-text('Layer {layer}, head {head} (share')", timeout=120_000)
    no_exception(page)
    picker = page.locator("[data-testid='stSelectbox']", has_text="Head").last
    assert picker.evaluate("e => e.innerText + ' ' + (e.querySelector('input')?.value || '')").rstrip().endswith(f"layer {layer}, head {head}")

    click_button(page, "Switch them off", expect="[data-testid='stMetricLabel']:has-text('KL divergence')")
    no_exception(page)
    assert page.locator("[data-testid='stMetricLabel']", has_text="Its rank now").count() == 1

    click_button(page, "Patch every layer and position", 600_000, expect="[data-testid='stMetricLabel']:has-text('corrupted')")
    no_exception(page)
    settled(page)
    assert page.locator(".js-plotly-plot").count() >= 6  # shares, largest, head row, graph, ablation, patching
    page.screenshot(path=str(SHOTS / f"why-{model}-interventions.png"))
