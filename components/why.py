"""The "Why this token" page's figures: every component's share of the logit (layer x head, with the feed-forward
column), the largest shares, a head's attention from the last position, and the distribution before and after
components are switched off."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from pipeline.common import shared

from .figures import BLUE, GREY, ORANGE, _layout


@shared
def shares_heatmap(heads: np.ndarray, ffn: np.ndarray, title: str) -> go.Figure:
    """[L, H] head shares beside an FFN column, one colour scale centred on 0 (red adds to the logit, blue takes)."""
    L, H = heads.shape
    z = np.concatenate([heads, ffn[:, None]], axis=1)
    x = [f"H{h}" for h in range(H)] + ["FFN"]
    m = float(np.abs(z).max()) or 1.0
    fig = go.Figure(
        go.Heatmap(
            z=z,
            x=x,
            y=[f"L{i}" for i in range(L)],
            colorscale="RdBu_r",
            zmin=-m,
            zmax=m,
            colorbar=dict(title="share"),
            texttemplate="",  # no number in each of L x (H + 1) cells, even on a slide: the bars below carry them
            hovertemplate="%{y} %{x}: %{z:+.3f}<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed", title="layer")
    fig.update_xaxes(title="attention head (and the feed-forward block)")
    return _layout(fig, title, height=max(380, 18 * L + 160))


@shared
def largest_figure(items: list[tuple[str, float]], title: str) -> go.Figure:
    names, vals = [n for n, _ in items], [v for _, v in items]
    fig = go.Figure(
        go.Bar(
            x=vals,
            y=names,
            orientation="h",
            marker_color=[ORANGE if v > 0 else BLUE for v in vals],
            text=[f"{v:+.2f}" for v in vals],
            textposition="outside",
            cliponaxis=False,
            hovertemplate="%{y}: %{x:+.3f}<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title="share of the logit", zeroline=True)
    return _layout(fig, title, height=max(320, 26 * len(items) + 120))


@shared
def head_row_figure(weights: np.ndarray, labels: list[str], title: str) -> go.Figure:
    """One head's attention from the last position to every token (page 3's view of that head, one row)."""
    fig = go.Figure(go.Bar(x=labels, y=weights, marker_color=BLUE, hovertemplate="%{x}: %{y:.3f}<extra></extra>"))
    fig.update_yaxes(title="attention weight", range=[0, 1])
    return _layout(fig, title, height=340)


@shared
def before_after_figure(cands: list[str], before: np.ndarray, after: np.ndarray, title: str) -> go.Figure:
    fig = go.Figure()
    for name, p, color in (("before", before, GREY), ("after", after, ORANGE)):
        fig.add_trace(
            go.Bar(x=p, y=cands, orientation="h", name=name, marker_color=color, text=[f"{v:.3f}" for v in p], textposition="outside", cliponaxis=False)
        )
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title="probability", range=[0, 1.15])
    fig.update_layout(barmode="group")
    return _layout(fig, title, height=max(360, 44 * len(cands) + 120))


@shared
def patching_figure(grid: np.ndarray, columns: list[str], title: str, by_position: bool = True) -> go.Figure:
    """[L, T] (or [L, H]) share of the logit difference restored by patching one (layer, position) (or one head's
    output at every position): 0 none, 1 all of it. `columns`: the tokens (or the heads' names)."""
    L, T = grid.shape
    fig = go.Figure(
        go.Heatmap(
            z=grid,
            x=[f"{i}:{t}" for i, t in enumerate(columns)] if by_position else columns,
            y=[f"L{i}" for i in range(L)],
            colorscale="Blues",
            zmin=0,
            zmax=1,
            colorbar=dict(title="restored"),
            texttemplate="",
            hovertemplate="%{y}, %{x}: %{z:.2f} of the difference back<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed", title="layer")
    fig.update_xaxes(title="position whose residual stream is restored" if by_position else "head whose output is restored at every position")
    return _layout(fig, title, height=max(380, 18 * L + 160))


@shared
def flow_figure(edges: list[tuple[int, int, int, float]], labels: list[str], n_layers: int, title: str) -> go.Figure:
    """The contribution graph: a node per (layer boundary, position), an edge from token j after layer l to position i
    after layer l + 1 as wide as its share (orange: read through attention; grey: the position's own residual
    stream), every edge on a path to the prediction (the last position after the last layer, a star)."""
    T = len(labels)
    fig = go.Figure()
    bins = ((0.0, 0.2, 1.5), (0.2, 0.5, 3.5), (0.5, 1.01, 6.0))
    for kind, color in (("residual stream", GREY), ("attention", ORANGE)):
        for lo, hi, width in bins:
            xs, ys = [], []
            for layer, j, i, w in edges:
                if (j == i) == (kind == "residual stream") and lo <= w < hi:
                    xs += [layer, layer + 1, None]
                    ys += [j, i, None]
            if xs:
                fig.add_trace(
                    go.Scatter(x=xs, y=ys, mode="lines", line=dict(color=color, width=width), name=f"{kind}, share {lo:g}-{min(hi, 1):g}", hoverinfo="skip")
                )
    nodes = {(layer, j) for layer, j, _, _ in edges} | {(layer + 1, i) for layer, _, i, _ in edges}
    fig.add_trace(
        go.Scatter(
            x=[n[0] for n in nodes],
            y=[n[1] for n in nodes],
            mode="markers",
            marker=dict(color=BLUE, size=6),
            name="a token's stream after a layer",
            text=[f"after layer {n[0] - 1}: {labels[n[1]]}" if n[0] else f"embedding: {labels[n[1]]}" for n in nodes],
            hovertemplate="%{text}<extra></extra>",
        )
    )
    fig.add_trace(go.Scatter(x=[n_layers], y=[T - 1], mode="markers", marker=dict(symbol="star", size=16, color=ORANGE), name="the prediction"))
    fig.update_yaxes(tickvals=list(range(T)), ticktext=labels if T <= 48 else None, autorange="reversed", title="token")
    fig.update_xaxes(title="layer boundary (0 = the embeddings)", range=[-0.5, n_layers + 0.5])
    return _layout(fig, title, height=min(900, max(420, 26 * T + 200)), legend=dict(orientation="h", y=-0.18))


@shared
def side_by_side_figure(names: list[str], rows: list[list[tuple[str, float]]], title: str) -> go.Figure:
    """Two prompts' next-token distributions, side by side: rows[k] = [(token, probability)] most likely first."""
    from plotly.subplots import make_subplots

    fig = make_subplots(rows=1, cols=len(rows), subplot_titles=names, horizontal_spacing=0.18)
    for k, row in enumerate(rows):
        fig.add_trace(
            go.Bar(
                x=[p for _, p in row],
                y=[t for t, _ in row],
                orientation="h",
                marker_color=(ORANGE, BLUE)[k % 2],
                text=[f"{p:.3f}" for _, p in row],
                textposition="outside",
                cliponaxis=False,
                showlegend=False,
            ),
            row=1,
            col=k + 1,
        )
        fig.update_yaxes(autorange="reversed", row=1, col=k + 1)
        fig.update_xaxes(range=[0, 1.2], title="probability", row=1, col=k + 1)
    return _layout(fig, title, height=max(360, 34 * max(len(r) for r in rows) + 140))
