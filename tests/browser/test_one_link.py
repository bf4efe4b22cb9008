"""A class on one link, in real Chromium (each visitor its own browser context, so its own cookies): a link
carries a view and never an identity, the demo limits follow the browser and not the link, and nothing from an
address (a ?p= id, a ?prompt=, any bound setting) is ever rendered as a link or an image or makes the browser
fetch anything."""

import re
import urllib.parse

import pytest
from playwright.sync_api import expect
from ui import ROOT, click_button, free_port, no_exception, settled, start_server, stop_server, visit, wait_idle

pytestmark = pytest.mark.browser

PAGES = [
    "",
    "tokens",
    "embeddings",
    "attention",
    "layer",
    "next-token",
    "generation",
    "prefill-decode",
    "kv-cache",
    "hardware",
    "roofline",
    "attention-kernels",
    "production",
    "speculative",
    "streaming-sharding",
    "batching",
    "misconceptions",
    "operator",
]


@pytest.fixture(scope="module")
def demo_server(tmp_path_factory):
    """A demo server as `make demo` runs it, from a folder whose .streamlit/secrets.toml allows 3 runs a minute
    per browser (so a test can reach the limit)."""
    cwd = tmp_path_factory.mktemp("operator")
    (cwd / ".streamlit").mkdir()
    (cwd / ".streamlit" / "config.toml").write_text((ROOT / ".streamlit" / "config.toml").read_text())
    (cwd / ".streamlit" / "secrets.toml").write_text("[demo]\nenabled = true\nrequests_per_minute = 3\n")
    proc, url = start_server(free_port(), cwd=cwd)
    yield url
    stop_server(proc)


def reload(page):
    page.reload(wait_until="domcontentloaded")
    page.wait_for_selector("h1", timeout=240_000)
    wait_idle(page, 300_000)


def drew(page) -> str:
    m = re.search(r"Seed (\d+) drew", page.locator("body").inner_text())
    return m.group(1) if m else ""


def set_number(page, key, value):
    box = page.locator(f".st-key-{key} input").first
    box.fill(str(value))
    box.press("Enter")
    wait_idle(page)


def test_two_browsers_on_one_link_keep_their_own_runs(server, browser):
    a = visit(browser, f"{server}/next-token?prompt=The+capital+of+France+is&seed=7")
    click_button(a, "Sample", expect="text=drew")
    assert drew(a) == "7"
    link = a.url
    query = urllib.parse.parse_qs(urllib.parse.urlparse(link).query)
    assert "s" not in query and not any(re.fullmatch(r"[0-9a-f]{16}", v[0]) for v in query.values()), link  # no identity in the link
    b = visit(browser, link)  # the class opens the teacher's link
    assert drew(b) == ""  # a view, not the teacher's runs
    set_number(b, "seed", 4242)
    click_button(b, "Sample", expect="text=drew")
    assert drew(b) == "4242"
    reload(a)  # the teacher refreshes: their own run, untouched by what the class did through the link
    assert drew(a) == "7"
    expect(a.locator(".st-key-seed input").first).to_have_value("7", timeout=60_000)  # waits on the page, not a clock
    reload(b)
    assert drew(b) == "4242"  # and the class keeps theirs


@pytest.mark.load  # a one-link scenario in Chromium (a minute each): make test-load
def test_a_frozen_copy_of_results_travels_only_when_asked(server, browser):
    a = visit(browser, f"{server}/next-token?prompt=The+capital+of+France+is&seed=11")
    click_button(a, "Sample", expect="text=drew")
    a.get_by_text("Share this view").first.click()
    click_button(a, "Add a copy of my results to the link")
    if not a.locator("code", has_text="view=").count():  # the popover closed with the rerun
        a.get_by_text("Share this view").first.click()
    link = a.locator("code", has_text="view=").first.inner_text().strip()
    assert re.search(r"view=[0-9a-f]{12}", link), link
    b = visit(browser, link)
    assert drew(b) == "11"  # a copy of the teacher's result
    assert "view" not in urllib.parse.parse_qs(urllib.parse.urlparse(b.url).query)
    set_number(b, "seed", 12)
    click_button(b, "Sample", expect="text=Seed 12 drew")
    reload(a)
    assert drew(a) == "11"


@pytest.mark.load  # a one-link scenario in Chromium (a minute each): make test-load
def test_a_shared_link_does_not_share_a_rate_limit(demo_server, browser):
    a = visit(browser, f"{demo_server}/generation?prompt=Dog+bites+man.&gen_n=2&gen_t=0.0")
    for _ in range(3):
        click_button(a, "Generate")
        no_exception(a)
    click_button(a, "Generate")
    assert "too many runs from this browser" in a.locator("body").inner_text()
    b = visit(browser, a.url)  # a student opens the teacher's link: a bucket of its own
    click_button(b, "Generate")
    no_exception(b)
    text = b.locator("body").inner_text()
    assert "too many runs" not in text and "Time to first token" in text


@pytest.mark.load  # every page walked again with hostile input: minutes (make test-load)
def test_nothing_from_an_address_is_rendered_or_fetched_on_any_page(demo_server, browser, tracker):
    url, hits = tracker
    hostile = f"![x]({url}/pixel.png) [Operator login]({url}/phish) <img src='{url}/img.png'> <a href='{url}/a'>a</a>"
    keys = set()
    for f in (ROOT / "views").rglob("*.py"):
        keys |= set(re.findall(r'key="(\w+)"', f.read_text()))
    keys |= {f"{p}_{s}" for p in ("gen", "hw", "sse", "myth") for s in ("n", "t", "k", "p", "minp", "seed")}
    query = {k: hostile for k in sorted(keys)} | {"p": hostile, "prompt": hostile, "view": hostile, "s": hostile}
    outside = []
    for path in PAGES:
        page = visit(browser, f"{demo_server}/{path}?{urllib.parse.urlencode(query)}", outside=outside)
        no_exception(page)
        settled(page)
        planted = page.evaluate(
            "u => [...document.querySelectorAll('a[href], img[src], iframe[src], link[href]')].filter(e => (e.href || e.src || '').startsWith(u)).length", url
        )
        assert planted == 0, path
        frames = [f for f in page.frames if f != page.main_frame]
        for fr in frames:  # bertviz and other views drawn in iframes
            assert fr.evaluate("u => [...document.querySelectorAll('a[href], img[src]')].filter(e => (e.href || e.src).startsWith(u)).length", url) == 0
        text = page.locator("body").inner_text()
        assert "Operator login" not in page.locator("a").all_inner_texts(), path
        assert url not in "".join(page.locator("a").evaluate_all("els => els.map(e => e.href)")), path
        assert "?p= is not a valid id" in text and "?view= is not a valid id" in text, path  # said as plain text, never echoed
        page.close()
    assert hits == [] and [u for u in outside if u.startswith(url)] == [], (hits, outside)
    assert sorted(set(outside)) == [], sorted(set(outside))  # nothing at all left the browser for another host
