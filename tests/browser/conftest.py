"""Browser-tier fixtures: one fresh server per test module, one Chromium per session."""

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
