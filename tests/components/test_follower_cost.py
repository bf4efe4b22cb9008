"""What makes a live class's follower cheap, checked for what it promises: one trace or figure made once however many
sessions ask at once (LRU.get's single flight), a page-ready figure's dictionary made once and equal to Plotly's own,
and followers' page runs taken in turns (views.live_wake.turn)."""

from __future__ import annotations

import threading
import time

import plotly.graph_objects as go
import pytest

from components.figures import FrozenFigure, copy_figure, frozen
from pipeline.common import LRU

pytestmark = pytest.mark.unit


def test_lru_get_makes_a_value_once_while_others_wait_for_it():
    cache, made, start = LRU(4), [], threading.Barrier(8)

    def make():
        made.append(1)
        time.sleep(0.2)
        return "trace"

    got = []

    def ask():
        start.wait()
        got.append(cache.get("k", make))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert made == [1] and got == ["trace"] * 8


def test_lru_get_after_a_failed_maker_the_next_one_tries():
    cache, calls = LRU(4), []

    def bad():
        calls.append("bad")
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        cache.get("k", bad)
    assert "k" not in cache
    assert cache.get("k", lambda: "good") == "good" and calls == ["bad"]


def test_lru_counts_a_value_being_made_as_kept():
    cache, inside, release = LRU(4), threading.Event(), threading.Event()

    def slow():
        inside.set()
        release.wait(5)
        return 1

    t = threading.Thread(target=cache.get, args=("k", slow))
    t.start()
    inside.wait(5)
    assert "k" in cache  # a follower asking now waits for it: not counted as a new run against its limits
    release.set()
    t.join()
    assert cache.peek("k") == 1


def _fig():
    return go.Figure(go.Heatmap(z=[[0.1, 0.2], [0.3, 0.4]], x=["a", "b"], y=["c", "d"]), layout=dict(title="t", height=300))


def test_frozen_figure_gives_plotlys_own_dictionary_once():
    fig = frozen(_fig())
    assert isinstance(fig, FrozenFigure)
    assert fig.to_dict() == _fig().to_dict()
    assert fig.to_dict() is fig.to_dict()  # made once, then handed out
    import plotly.io as pio

    assert pio.to_json(fig.to_dict(), validate=False) == pio.to_json(_fig().to_dict(), validate=False)


def test_a_copy_of_a_frozen_figure_is_a_plain_figure_that_can_change():
    fig = frozen(_fig())
    fig.to_dict()
    c = copy_figure(fig)
    assert type(c) is go.Figure
    c.update_layout(height=500)
    assert c.to_dict()["layout"]["height"] == 500 and fig.to_dict()["layout"]["height"] == 300


def test_followers_runs_take_turns():
    from views import live_wake

    now, most, lock = [0], [0], threading.Lock()

    def run():
        with live_wake.turn(True):
            with lock:
                now[0] += 1
                most[0] = max(most[0], now[0])
            time.sleep(0.05)
            with lock:
                now[0] -= 1

    threads = [threading.Thread(target=run) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert most[0] == live_wake.AT_ONCE
    with live_wake.turn(False):  # anyone else: no turn to wait for
        pass
