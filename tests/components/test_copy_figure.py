"""Copies of one figure made by many threads at once (a live class's followers drawing the same shared figure):
plotly's constructor takes each source trace's type out of its properties while it copies, so unguarded concurrent
copies built scatter traces from bar and heatmap properties. components.figures.copy_figure copies one at a time."""

import threading

import plotly.graph_objects as go
import pytest

from components.figures import copy_figure

pytestmark = pytest.mark.unit


def _copies(copy, threads=6, each=40):
    fig = go.Figure([go.Bar(x=[1, 2, 3], y=[3, 1, 2], text=["a", "b", "c"], textposition="outside"), go.Heatmap(z=[[1, 2], [3, 4]], colorscale="Viridis")])
    errors, types = [], set()
    start = threading.Barrier(threads)

    def work():
        start.wait()
        for _ in range(each):
            try:
                types.add(tuple(t.type for t in copy(fig).data))
            except ValueError as e:
                errors.append(str(e).splitlines()[0])

    ts = [threading.Thread(target=work) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return errors, types, fig


def test_many_threads_copying_one_figure_get_its_traces():
    """With thread switches as often as the interpreter allows, plain `type(fig)(fig)` failed here within a few copies
    ("Invalid property specified for object of type plotly.graph_objs.Scatter ...", 2026-12-04)."""
    import sys

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        errors, types, fig = _copies(copy_figure)
    finally:
        sys.setswitchinterval(old)
    assert errors == [] and types == {("bar", "heatmap")}
    assert [t.type for t in fig.data] == ["bar", "heatmap"], "the source as it was"
