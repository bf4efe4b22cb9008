"""The "Why this token" page's figures: every component's share of the logit (layer x head, with the feed-forward
column), the largest shares, a head's attention from the last position, and the distribution before and after
components are switched off."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from .figures import BLUE, GREY, ORANGE, _layout


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


def head_row_figure(weights: np.ndarray, labels: list[str], title: str) -> go.Figure:
    """One head's attention from the last position to every token (page 3's view of that head, one row)."""
    fig = go.Figure(go.Bar(x=labels, y=weights, marker_color=BLUE, hovertemplate="%{x}: %{y:.3f}<extra></extra>"))
    fig.update_yaxes(title="attention weight", range=[0, 1])
    return _layout(fig, title, height=340)


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


def patching_figure(grid: np.ndarray, tokens: list[str], title: str) -> go.Figure:
    """[L, T] share of the logit difference restored by patching one (layer, position): 0 none, 1 all of it."""
    L, T = grid.shape
    fig = go.Figure(
        go.Heatmap(
            z=grid,
            x=[f"{i}:{t}" for i, t in enumerate(tokens)],
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
    fig.update_xaxes(title="position whose residual stream is restored")
    return _layout(fig, title, height=max(380, 18 * L + 160))
