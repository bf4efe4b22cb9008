"""The class load test (bench/bench_class.py): 32 visitors, 4 of them real Chromium tabs, on a fresh demo server
for LOAD_MINUTES (default 5): no error, no cross-talk, every cancelled request freed, the server's memory flat."""

import importlib.util
import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.load
ROOT = Path(__file__).resolve().parents[2]


def test_a_class_of_32_on_the_demo_server():
    if not Path("/usr/bin/chromium").exists():
        pytest.skip("apt-get install -y chromium")
    spec = importlib.util.spec_from_file_location("bench_class", ROOT / "bench" / "bench_class.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    r = bench.run(minutes=float(os.environ.get("LOAD_MINUTES", "5")), browsers=4, api=28)
    print(r)
    assert r["errors"] == [] and r["crosstalk"] == []
    assert r["visitors"]["browser visits"] >= 4 and r["visitors"]["api answers checked"] >= 28
    assert r["cancelled_not_freed"] == {"running": 0, "waiting": 0, "blocks_used": 0}
    rss = r["server_rss_mb"]
    assert rss["end"] - rss["after_warm_up"] < max(400, 0.3 * rss["after_warm_up"]), rss  # bounded caches, no leak per prompt
