"""Figures for the batching page, drawn from a scene's iteration records (pipeline.lab.scene.SceneRun)."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from pipeline.common import shared
from pipeline.engine import State
from pipeline.lab import ScenePolicy

from .figures import BLUE, GREEN, GREY, ORANGE, RED, _layout

STATE_COLORS = {State.WAITING: GREY, State.PREFILL: ORANGE, State.DECODE: BLUE, State.PADDING: RED}
POLICY_COLORS = {ScenePolicy.ONE_BY_ONE: GREY, ScenePolicy.STATIC: ORANGE, ScenePolicy.CONTINUOUS: GREEN}


def _segments(run):
    """Per user: [(state, start s, end s)], from the request's own timestamps and the iteration records."""
    out = {}
    for u in run.users:
        segs = []
        if u.admitted_s is not None:
            segs.append((State.WAITING, u.arrival_s, max(u.arrival_s, u.admitted_s)))
        if u.first_token_s is not None:
            segs.append((State.PREFILL, u.admitted_s, u.first_token_s))
        if u.done_s is not None:
            segs.append((State.DECODE, u.first_token_s, u.done_s))
        pads = [r.t1 for r in run.records if u.request_id in r.padded]
        if pads:
            segs.append((State.PADDING, u.done_s, max(pads)))
        out[u.name] = segs
    return out


@shared
def gantt_figure(runs) -> go.Figure:
    """One row per user per policy: waiting in line, prefill, decode, and (static batching) the padding a
    finished answer keeps computing until the batch's longest is done. Shared time axis (seconds)."""
    fig = make_subplots(
        rows=len(runs), cols=1, shared_xaxes=True, vertical_spacing=0.08, subplot_titles=[f"{r.policy}: {r.tokens} tokens in {r.wall_s:.1f} s" for r in runs]
    )
    shown = set()
    for k, run in enumerate(runs):
        for name, segs in _segments(run).items():
            for state, a, b in segs:
                if a is None or b is None or b <= a:
                    continue
                fig.add_trace(
                    go.Bar(
                        y=[name],
                        x=[b - a],
                        base=[a],
                        orientation="h",
                        name=str(state),
                        marker_color=STATE_COLORS[state],
                        legendgroup=str(state),
                        showlegend=state not in shown,
                        hovertemplate=f"{name}: {state} %{{base:.2f}}–%{{x:.2f}} s<extra></extra>",
                    ),
                    row=k + 1,
                    col=1,
                )
                shown.add(state)
        fig.update_yaxes(autorange="reversed", dtick=1, row=k + 1, col=1)  # every user named, none skipped
    fig.update_xaxes(title="seconds since the first arrival", row=len(runs), col=1)
    fig.update_layout(barmode="overlay")
    # the legend at the figure's foot (container coordinates): under the axis title at any font size
    fig = _layout(fig, "Who was served when", height=170 * len(runs) + 120, legend=dict(orientation="h", yref="container", y=0.0, yanchor="bottom"))
    fig.update_layout(margin=dict(b=110))
    return fig


@shared
def occupancy_figure(runs) -> go.Figure:
    """Rows in each iteration's forward (answers being produced), and static batching's padding rows."""
    fig = go.Figure()
    for run in runs:
        c = POLICY_COLORS.get(run.policy, BLUE)
        x = [r.t1 for r in run.records]
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[len(r.decode) + len(r.prefill) for r in run.records],
                mode="lines",
                line=dict(color=c, shape="hv"),
                name=f"{run.policy}: requests served",
            )
        )
        if any(r.padded for r in run.records):
            fig.add_trace(
                go.Scatter(
                    x=x,
                    y=[len(r.decode) + len(r.prefill) + len(r.padded) for r in run.records],
                    mode="lines",
                    line=dict(color=c, shape="hv", dash="dot"),
                    name=f"{run.policy}: rows computed (with padding)",
                )
            )
    fig.update_xaxes(title="seconds since the first arrival")
    fig.update_yaxes(title="requests in the batch", rangemode="tozero", dtick=1)
    return _layout(fig, "Batch occupancy per iteration", height=340, legend=dict(orientation="h", y=-0.3))


@shared
def kv_figure(run) -> go.Figure:
    """KV blocks held per request over the run (stacked), against the time axis."""
    names = {u.request_id: u.name for u in run.users}
    fig = go.Figure()
    for rid, name in names.items():
        fig.add_trace(
            go.Scatter(
                x=[r.t1 for r in run.records],
                y=[r.blocks.get(rid, 0) for r in run.records],
                mode="lines",
                stackgroup="kv",
                name=name,
                line=dict(shape="hv"),
                hovertemplate=name + ": %{y} blocks<extra></extra>",
            )
        )
    mib = run.kv_block_bytes / 2**20
    fig.update_xaxes(title="seconds since the first arrival")
    fig.update_yaxes(title=f"KV blocks ({run.block_size} tokens, {mib:.2f} MiB each)", rangemode="tozero")
    return _layout(fig, f"KV memory held, {run.policy}", height=320, legend=dict(orientation="h", y=-0.3))


@shared
def latency_figure(runs) -> go.Figure:
    """Each user's time to first token and time to the whole answer, per policy."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["time to first token (s)", "time to the whole answer (s)"])
    for run in runs:
        c = POLICY_COLORS.get(run.policy, BLUE)
        names = [u.name for u in run.users]
        fig.add_trace(go.Bar(x=names, y=[u.ttft_s for u in run.users], name=run.policy, marker_color=c, legendgroup=run.policy), 1, 1)
        fig.add_trace(go.Bar(x=names, y=[u.latency_s for u in run.users], name=run.policy, marker_color=c, legendgroup=run.policy, showlegend=False), 1, 2)
    fig.update_layout(barmode="group")
    return _layout(fig, "What each user waited (from their own arrival)", height=340, legend=dict(orientation="h", y=-0.2))
