"""Figures built once per server (pipeline.common.memo.shared): equal arguments give the very object built before, other
arguments another; the cache stays bounded and takes concurrent callers; and no page changes a figure it was handed
(it is shared between visitors), checked by running pages twice in both modes."""

import threading
from pathlib import Path

import numpy as np
import pytest

from components.figures import matrix_heatmap
from pipeline.common import memo


@pytest.mark.unit
def test_equal_arguments_share_one_figure_and_others_do_not():
    z = np.arange(6, dtype=np.float32).reshape(2, 3)
    a = matrix_heatmap(z, ["a", "b", "c"], ["x", "y"], "t")
    b = matrix_heatmap(z.copy(), ["a", "b", "c"], ["x", "y"], "t")  # equal bytes, another array
    assert a is b and a._shared_key
    z2 = z.copy()
    z2[0, 0] = 0.5
    assert matrix_heatmap(z2, ["a", "b", "c"], ["x", "y"], "t") is not a, "other values, another figure"
    assert matrix_heatmap(z, ["a", "b", "c"], ["x", "y"], "t2") is not a, "another title, another figure"
    assert matrix_heatmap(z.astype(np.float64), ["a", "b", "c"], ["x", "y"], "t") is not a, "another dtype"
    assert matrix_heatmap(z, ["a", "b", "c"], ["x", "y"], "t", height=200) is not a, "a keyword counts"


@pytest.mark.unit
def test_digest_refuses_what_is_not_plain_data():
    assert memo.digest(np.zeros(3), [1, "a"], {"k": (2.0, None)}) is not None
    assert memo.digest(object()) is None
    assert memo.digest(np.array([object()])) is None
    assert memo.digest([1, 2]) != memo.digest((1, 2)) and memo.digest("1") != memo.digest(1)
    calls = []

    @memo.shared
    def build(x):
        calls.append(x)
        return [len(calls)]

    thing = object()
    build(thing), build(thing)
    assert len(calls) == 2, "an argument that cannot be hashed: the builder runs every time"


@pytest.mark.unit
def test_lru_is_bounded_by_count_and_bytes_and_thread_safe():
    c = memo.LRU(3, 100)
    for i in range(5):
        c.put(str(i), i, 10)
    assert len(c) == 3 and c.peek("0") is None and c.peek("4") == 4
    c.peek("2")  # used: kept over 3
    c.put("5", 5, 10)
    assert c.peek("3") is None and c.peek("2") == 2
    c.put("big", "x", 95)
    assert len(c) == 1 and c.peek("big") == "x", "over the bytes: the oldest go first"

    lru = memo.LRU(50, 1 << 30)

    def hammer(t):
        for i in range(2000):
            lru.put(f"{t}-{i % 80}", i, 1)
            lru.peek(f"{(t + 1) % 4}-{i % 80}")

    threads = [threading.Thread(target=hammer, args=(t,)) for t in range(4)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert len(lru) == 50 and lru.bytes == 50


@pytest.mark.model
@pytest.mark.parametrize("present", [False, True])
def test_no_page_changes_a_figure_it_was_handed(present):
    from streamlit.testing.v1 import AppTest

    app = str(Path(__file__).resolve().parents[2] / "app.py")
    pages = ["views/stages/tokens.py", "views/stages/attention.py", "views/stages/layer.py", "views/stages/next_token.py", "views/stages/overview.py"]
    at = AppTest.from_file(app, default_timeout=240)
    at.session_state["prompt"] = "Dog bites man."
    if present:
        at.session_state["present"] = True
    at.run()
    for p in pages:
        at.switch_page(p).run()
        assert not at.exception, (p, at.exception)
    built = {k: (v, v.to_json()) for k, v in memo.BUILT.items.items() if hasattr(v, "to_json")}
    assert len(built) >= 5, "the pages' figures come from the shared builders"
    for p in pages:
        at.switch_page(p).run()
    changed = [k for k, (fig, before) in built.items() if fig.to_json() != before]
    assert not changed, f"{len(changed)} shared figures changed by a page run"
    assert memo.BUILT.hits > 0, "the second visit drew figures built by the first"


@pytest.mark.unit
def test_fresh_for_reads_again_after_its_time_or_when_its_key_changes(monkeypatch):
    import time

    now, key, reads = [100.0], ["a"], []
    monkeypatch.setattr(time, "monotonic", lambda: now[0])

    @memo.fresh_for(1.0, key=lambda: key[0])
    def read():
        reads.append(1)
        return len(reads)

    assert read() == 1 and read() == 1  # within the second: kept
    now[0] += 0.5
    assert read() == 1
    key[0] = "b"  # the environment changed: read at once
    assert read() == 2
    now[0] += 1.5  # the time passed: read again
    assert read() == 3 and len(reads) == 3
    read.forget()
    assert read() == 4
