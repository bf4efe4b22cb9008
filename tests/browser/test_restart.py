"""After the server restarts, a returning browser is told so, and what was lost; a refresh on the same server is not."""

import pytest
from ui import free_port, start_server, stop_server, wait_idle

pytestmark = pytest.mark.browser

SAID = "This server restarted"


def test_a_browser_is_told_the_server_restarted(browser):
    port = free_port()
    proc, url = start_server(port)
    ctx = browser.new_context(viewport={"width": 1300, "height": 1200})
    page = ctx.new_page()
    try:
        page.goto(url, wait_until="domcontentloaded")
        page.wait_for_selector("h1", timeout=240_000)
        wait_idle(page, 300_000)
        names = {c["name"] for c in ctx.cookies()}
        assert {"llm_explorer_browser", "llm_explorer_server"} <= names, names
        page.reload(wait_until="domcontentloaded")  # the same server: nothing to say
        page.wait_for_selector("h1", timeout=240_000)
        wait_idle(page, 300_000)
        assert SAID not in page.locator("body").inner_text()
        stop_server(proc)
        proc, url = start_server(port)
        page.goto(url, wait_until="domcontentloaded")
        page.wait_for_selector("h1", timeout=240_000)
        wait_idle(page, 300_000)
        text = page.locator("body").inner_text()
        assert SAID in text and "are kept" in text, text[:2000]
    finally:
        ctx.close()
        stop_server(proc)
