"""The lesson handout: one HTML file for "Why is the sky blue?" with every stage in the article's order, under 15
MB, that opens in Chromium with the network cut off and draws every figure."""

import re

import pytest

import pipeline
from views import handout, pages

pytestmark = pytest.mark.browser

STAGES = pages.STAGES[1:]  # every stage after the overview, in the article's order


def test_handout_opens_offline_with_every_stage(tmp_path, smol, browser):
    tr = pipeline.trace(smol, "Why is the sky blue?", chat=True)
    body = handout.build(smol, tr, STAGES)
    size = len(body.encode())
    assert size < 15e6, f"{size / 1e6:.1f} MB"
    text = re.sub(r"<script>.*?</script>", "", body, flags=re.S)  # plotly.js itself holds a U+FFFD
    assert "\ufffd" not in text and "Why is the sky blue?" in text
    titles = re.findall(r"<h2>(.*?)</h2>", body)
    assert [t.replace("&amp;", "&") for t in titles] == [s.title for s in STAGES]  # every stage, in the article's order
    assert "Could not be drawn" not in body
    assert "The loop seen from the KV cache" in body  # the decode steps (issue 57), recorded for the handout
    assert body.count("class='pass'") >= 5 and "class='fail'" not in body  # the cross-checks, run and passed
    path = tmp_path / "handout.html"
    path.write_text(body, encoding="utf-8")
    outside = []
    context = browser.new_context(viewport={"width": 1200, "height": 900})  # the session's Chromium
    page = context.new_page()
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(("file:", "data:", "blob:")) else (outside.append(r.request.url), r.abort()))
    page.goto(path.as_uri())
    page.wait_for_function("() => document.querySelectorAll('.js-plotly-plot .main-svg').length >= 7", timeout=60_000)
    sections = page.locator("section").count()
    drawn = page.evaluate("() => [...document.querySelectorAll('.js-plotly-plot')].every(p => p.querySelector('.main-svg'))")
    context.close()
    assert sections == len(STAGES) and drawn and not outside, (sections, drawn, outside)
