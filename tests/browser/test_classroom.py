"""A teacher's features in real Chromium: a link reproduces a view, a refresh keeps it, presentation mode,
generated code shown verbatim, figures exported as SVG and 3x PNG, page 16 with its checks.

Screenshots of this walk go to artifacts/; the documented ones are taken by test_presentation.py."""

import struct
import time
import urllib.parse

import pytest
from playwright.sync_api import expect
from ui import ROOT, click_button, no_exception, settled, wait_idle

pytestmark = pytest.mark.browser

SHOTS = ROOT / "artifacts" / "screenshots" / "present-walk"  # the docs' presentation screenshots: test_presentation.py


def visit(browser, url, height=1400):
    page = browser.new_page(viewport={"width": 1400, "height": height}, accept_downloads=True)
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector("h1", timeout=240_000)
    wait_idle(page, 300_000)
    no_exception(page)
    return page


def q(**params) -> str:
    return urllib.parse.urlencode(params, quote_via=urllib.parse.quote)


def slider_value(page, key):
    return page.locator(f".st-key-{key} [data-testid='stSliderThumbValue']").first.inner_text()


@pytest.mark.load  # a classroom scenario in Chromium (a minute each): make test-load
def test_a_link_reproduces_the_view_and_a_refresh_keeps_it(server, browser):
    page = visit(browser, f"{server}/attention?{q(prompt='Dog bites man.', attn_head=3, attn_layer=5)}")
    assert "3 · Attention" in page.locator("h1").first.inner_text()
    expect(page.locator("[data-testid='stSidebar'] textarea").first).to_have_value("Dog bites man.", timeout=30_000)
    assert slider_value(page, "attn_head") == "3" and slider_value(page, "attn_layer") == "5"
    page.reload(wait_until="domcontentloaded")
    page.wait_for_selector("h1", timeout=240_000)
    wait_idle(page)
    expect(page.locator("[data-testid='stSidebar'] textarea").first).to_have_value("Dog bites man.", timeout=30_000)
    assert slider_value(page, "attn_head") == "3"
    # another page, another setting, typed into the address bar by a student
    other = visit(browser, f"{server}/next-token?{q(prompt='The capital of France is', temperature=1.3, top_k=5)}")
    assert slider_value(other, "temperature") == "1.30" and slider_value(other, "top_k") == "5"
    assert "temperature=1.3" in other.url and "top_k=5" in other.url  # the address keeps them for the next student


@pytest.mark.load  # a classroom scenario in Chromium (a minute each): make test-load
def test_a_prompt_too_long_for_a_link_travels_as_an_id(server, browser):
    long = "The quick brown fox jumps over the lazy dog. " * 60  # 2,700 characters
    page = visit(browser, server)
    box = page.locator("[data-testid='stSidebar'] textarea").first
    box.fill(long)
    box.press("Control+Enter")
    wait_idle(page)
    url = page.url
    assert "p=" in url and "prompt=" not in url and len(url) < 300, url
    fresh = visit(browser, url)  # another browser opens the link
    expect(fresh.locator("[data-testid='stSidebar'] textarea").first).to_have_value(long, timeout=30_000)


@pytest.mark.load  # every page walked again and screenshotted: minutes (make test-load)
def test_presentation_mode_renders_every_page_without_the_sidebar(server, browser):
    SHOTS.mkdir(parents=True, exist_ok=True)
    paths = [
        *("", "tokens", "embeddings", "attention", "layer", "next-token", "generation", "prefill-decode", "kv-cache", "hardware"),
        *("roofline", "attention-kernels", "production", "speculative", "streaming-sharding", "batching", "misconceptions"),
    ]
    page = visit(browser, f"{server}/?{q(present='true', prompt='Why is the sky blue?', chat='true')}", height=2000)
    for path in paths:
        page.goto(f"{server}/{path}?{q(present='true', prompt='Why is the sky blue?', chat='true')}", wait_until="domcontentloaded")
        page.wait_for_selector("h1", timeout=240_000)
        wait_idle(page, 300_000)
        no_exception(page)
        assert not page.locator("[data-testid='stSidebar']").first.is_visible(), path
        assert page.locator("[data-testid='stAlertContentInfo']").count() >= 1  # the takeaway
        settled(page)
        page.screenshot(path=str(SHOTS / f"{path or 'overview'}.png"), full_page=True)
    # the guided path: the next stage keeps the prompt
    page.goto(f"{server}/tokens?{q(present='true', prompt='Dog bites man.')}", wait_until="domcontentloaded")
    wait_idle(page, 300_000)
    page.get_by_role("link", name="2 →").click()  # the next stage, by number (the full title is its tooltip)
    wait_idle(page)
    assert "2 · Embeddings" in page.locator("h1").first.inner_text()
    # the link carries the prompt, and the sidebar's bound prompt box writes it again after the click: the same value
    # may appear twice in the address bar (Streamlit keeps both); a copied link's href has it once (test_presentation)
    assert set(urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)["prompt"]) == {"Dog bites man."}


@pytest.mark.load  # a classroom scenario in Chromium (a minute each): make test-load
def test_generated_code_keeps_its_newlines_and_indentation(server, browser):
    import pipeline
    from pipeline.generation import generate

    lm = pipeline.load_model()
    prompt = "Write a Python function that adds two numbers."
    want = "".join(e.text for e in generate(lm, prompt, 40, chat=True))
    page = visit(browser, f"{server}/generation?{q(prompt=prompt, chat='true', gen_n=40, gen_t='0.0')}")
    click_button(page, "Generate", 300_000)
    no_exception(page)
    codes = page.locator("[data-testid='stCode'] code").all_inner_texts()
    assert any(c.rstrip() == want.rstrip() for c in codes), (want, codes)
    if "\n    " in want:
        assert any("\n    " in c for c in codes)
    assert page.locator("h1, h2, h3").filter(has_text="Test").count() == 0  # a generated "# ..." line is no heading


@pytest.mark.load  # a classroom scenario in Chromium (a minute each): make test-load
def test_figures_export_as_svg_and_3x_png(server, browser):
    page = visit(browser, f"{server}/next-token?{q(prompt='The capital of France is')}")
    with page.expect_download(timeout=120_000) as d:
        page.get_by_role("button", name="SVG").first.click()
    svg = open(d.value.path(), "rb").read().decode()
    assert d.value.suggested_filename.startswith("5-next-token_") and d.value.suggested_filename.endswith(".svg")
    assert svg.startswith("<svg") and "Paris" in svg
    with page.expect_download(timeout=120_000) as d:
        page.get_by_role("button", name="PNG ×3").first.click()
    png = open(d.value.path(), "rb").read()
    w, h = struct.unpack(">II", png[16:24])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and w == 3600 and h >= 3 * 360
    with page.expect_download(timeout=180_000) as d:
        page.get_by_role("button", name="Export this page").first.click()
    assert d.value.suggested_filename.endswith(".zip")


@pytest.mark.load  # a classroom scenario in Chromium (a minute each): make test-load
def test_misconceptions_page_runs_its_experiments(server, browser):
    page = visit(browser, f"{server}/misconceptions?{q(prompt='The capital of France is')}", height=3000)
    click_button(page, "Generate, then force one token", 300_000)
    no_exception(page)
    body = page.locator("body").inner_text()
    for claim in ("writes the whole answer", "reads words", "smarter", "longer context is free", "remembers earlier chats"):
        assert claim in body, claim
    assert "changing one token changes what follows" in body and "the same logits before and after" in body


def test_a_run_survives_a_refresh(server, browser):
    page = visit(browser, f"{server}/next-token?{q(prompt='The capital of France is')}")
    click_button(page, "Sample")
    assert "drew" in page.locator("body").inner_text()
    assert "s" not in urllib.parse.parse_qs(urllib.parse.urlparse(page.url).query)  # the address never carries who we are
    page.reload(wait_until="domcontentloaded")
    page.wait_for_selector("h1", timeout=240_000)
    wait_idle(page)
    assert "drew" in page.locator("body").inner_text()  # a new Streamlit session, the same browser's runs


@pytest.mark.load  # a classroom scenario in Chromium (a minute each): make test-load
def test_a_tab_closed_mid_generation_frees_its_request(server, browser):
    """Closing the tab stops its script (Streamlit asks it to stop on disconnect), the stream closes and the engine
    cancels the request: the operator page (open on one's own machine) sees it running, then cancelled."""
    op = visit(browser, f"{server}/operator")

    def metric(label):
        return int(op.locator("[data-testid='stMetric']").filter(has_text=label).locator("[data-testid='stMetricValue']").inner_text())

    def running():
        return metric("Generations running")

    def cancelled():
        return metric("Generations cancelled")

    page = visit(browser, f"{server}/generation?{q(prompt='Why is the sky blue?', chat='true', gen_n=1000, gen_t='0.0')}")
    page.get_by_role("button", name="Generate").first.click()
    deadline = time.time() + 120
    while running() == 0 and time.time() < deadline:  # the operator page refreshes every 3 s
        op.wait_for_timeout(500)
    assert running() == 1
    before = cancelled()
    page.close()
    t = time.time()
    while running() and time.time() - t < 60:
        op.wait_for_timeout(500)
    assert running() == 0 and cancelled() == before + 1  # cancelled, not ended by itself
