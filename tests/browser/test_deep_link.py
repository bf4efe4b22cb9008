"""A link a teacher shares is the first thing a fresh server sees: it must open that page, with the sidebar.

Streamlit treats a folder named pages/ next to the entry script as its legacy page list; while our pages lived
there, a deep link as the first request after a start listed the raw files and lost the sidebar, and /common
rendered a blank page. This module's server is fresh: its first request is the deep link."""

import pytest
from playwright.sync_api import expect
from ui import no_exception, wait_idle

pytestmark = pytest.mark.browser


def first_visit(browser, url):
    """A new session whose first request is `url`, rendered and idle, without an exception."""
    page = browser.new_page(viewport={"width": 1400, "height": 1200})
    page.goto(url, wait_until="domcontentloaded")
    page.wait_for_selector("h1", timeout=240_000)
    wait_idle(page, 300_000)
    no_exception(page)
    return page


def test_first_request_is_a_deep_link(server, browser):
    page = first_visit(browser, f"{server}/kv-cache")
    assert "KV cache" in page.locator("h1").first.inner_text()
    nav = page.locator("[data-testid='stSidebarNavLink']").all_inner_texts()
    assert any("Prompt & tokens" in t for t in nav) and not any(t.strip() in ("app", "common", "render", "runs", "guard") for t in nav)
    sidebar = page.locator("[data-testid='stSidebar']")
    expect(sidebar.locator("textarea")).to_have_count(1, timeout=60_000)  # the prompt box is there (waits on the page)
    expect(sidebar).to_contain_text("Model")
    assert "The prompt is empty" not in page.inner_text("body")
    # a second visitor's first request, another deep link, in a new session
    other = first_visit(browser, f"{server}/tokens")
    expect(other.locator("h1").first).to_contain_text("Prompt & tokens")
    expect(other.locator("[data-testid='stSidebar'] textarea")).to_have_count(1, timeout=60_000)


def test_internal_modules_are_not_pages(server, browser):
    page = browser.new_page(viewport={"width": 1200, "height": 800})
    for path in ("common", "render", "runs"):
        page.goto(f"{server}/{path}", wait_until="domcontentloaded")
        page.wait_for_selector("[data-testid='stSidebar']", timeout=240_000)
        wait_idle(page, 300_000)
        no_exception(page)
        nav = page.locator("[data-testid='stSidebarNavLink']").all_inner_texts()
        assert not any(t.strip() in ("common", "render", "runs") for t in nav)
