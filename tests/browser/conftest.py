"""Browser-tier fixtures: one fresh server per test module, one Chromium per session."""

import http.server
import threading
from pathlib import Path

import pytest
from ui import CHROMIUM, FLAGS, free_port, start_server, stop_server


def pytest_collection_modifyitems(config, items):
    if not Path(CHROMIUM).exists():
        skip = pytest.mark.skip(reason="apt-get install -y chromium")
        for item in items:
            if "/tests/browser/" in str(item.path):
                item.add_marker(skip)


@pytest.fixture(scope="module")
def server():
    proc, url = start_server(free_port())
    yield url
    stop_server(proc)


@pytest.fixture(scope="session")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def opened():
    """Every browser context a test opens, closed after it (a live class's follower left open keeps beating against the
    server)."""
    ctxs = []
    yield ctxs
    for c in ctxs:
        c.close()


@pytest.fixture(scope="module")
def tracker():
    """A server that records every request: a rendered <img>, a Markdown image or a followed link would call it."""
    hits = []

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            hits.append(self.path)
            self.send_response(404)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", free_port()), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", hits
    srv.shutdown()
