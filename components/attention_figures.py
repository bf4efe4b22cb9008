"""Attention's figures (page 3, the handout): one layer's heads as heatmaps, the mosaic of every head, grouped-query
attention's sharing of keys and values."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from pipeline.common import shared

from .figures import BLUE, GREEN, ORANGE, RED, SEQ, _layout

ATTENTION_SCALES = {
    "linear": "colour = the weight, 0 to 1",
    "log": "colour = log₁₀ of the weight, 0.0001 to 1: small weights stay visible next to the first-token sink",
    "row": "colour = the weight ÷ its row's largest: each query's own pattern, whatever the sink takes",
}


@shared
def attention_heads(
    maps: np.ndarray, labels: list[str], block: int = 1, max_cols: int = 3, layer: int = 0, scale: str = "linear", heads: list[int] | None = None
) -> go.Figure:
    """One layer's heads as a grid of heatmaps [H, T', T'], causal upper triangle masked (blank). `scale`: one of
    ATTENTION_SCALES (on long prompts the first token soaks up most weight and a linear scale shows little else).
    `heads`: only these (a projector shows one head large: nine 65-px maps in a 430-px figure were unreadable)."""
    names = list(range(maps.shape[0])) if heads is None else list(heads)
    maps = maps[names]
    H, n, _ = maps.shape
    cols = min(max_cols, H)
    rows = -(-H // cols)
    labelled = n <= 96  # token names on the outer axes (shared), every one of them, up to 96 rows
    fig = make_subplots(
        rows=rows,
        cols=cols,
        subplot_titles=[f"head {h}" for h in names] if H > 1 else None,
        shared_xaxes=labelled,
        shared_yaxes=labelled,
        horizontal_spacing=0.02 if labelled else 0.03,
        vertical_spacing=0.06 if n <= 16 else 0.04,
    )
    if block == 1:
        ticks = labels
    else:
        ticks = [f"{i * block}–{min(len(labels), (i + 1) * block) - 1}" for i in range(n)]
    mask = np.triu(np.ones((n, n), bool), k=1)
    for h in range(H):
        fig.add_trace(_head_map(maps[h], mask, ticks, scale, first=h == 0), row=h // cols + 1, col=h % cols + 1)
    most = 20 if H > 1 or n <= 20 else 16  # labels an axis: 12-px text (18 px on a projector, one head) that never overlaps
    step = 1 if n <= most else -(-n // most)
    fig.update_yaxes(autorange="reversed", showticklabels=False, type="category", dtick=step)
    fig.update_xaxes(showticklabels=False, tickangle=-60, type="category", dtick=step)
    if labelled:  # token names once: left column, and under each column's last map
        fig.update_yaxes(showticklabels=True, col=1)
        for h in range(max(0, H - cols), H):
            fig.update_xaxes(showticklabels=True, row=h // cols + 1, col=h % cols + 1)
    what = "every head" if heads is None else f"head {names[0]}" if H == 1 else "heads " + ", ".join(map(str, names))
    fig = _layout(fig, f"Layer {layer}: {what} (rows = query token, columns = key token)", height=max(360, (330 if n <= 16 else 380) * rows))
    if H > 1:
        fig.update_layout(margin=dict(t=80))  # room between the title and the "head n" titles
    return fig


def _head_map(m: np.ndarray, mask: np.ndarray, ticks: list[str], scale: str, first: bool) -> go.Heatmap:
    """One head's heatmap: the causal upper triangle blank, colour by `scale` (ATTENTION_SCALES), the weight itself
    in the hover; only the first map carries the colour bar."""
    w = m.astype(np.float32).copy()
    w[mask] = np.nan
    if scale == "log":
        z, lo, hi = np.log10(np.maximum(w, 1e-4)), -4, 0
        bar = dict(tickvals=[-4, -3, -2, -1, 0], ticktext=["0.0001", "0.001", "0.01", "0.1", "1"], title="weight")
    elif scale == "row":
        z, lo, hi = w / np.maximum(np.nanmax(w, axis=1, keepdims=True), 1e-9), 0, 1
        bar = dict(title="÷ row max")
    else:
        z, lo, hi, bar = w, 0, 1, dict(title="weight")
    return go.Heatmap(
        z=np.round(z, 3),
        customdata=np.round(w, 4),
        x=ticks,
        y=ticks,
        colorscale=SEQ,
        zmin=lo,
        zmax=hi,
        showscale=first,
        colorbar=bar,
        hovertemplate="query %{y}<br>key %{x}<br>weight %{customdata:.4f}<extra></extra>",
    )


def without_sink(maps: np.ndarray) -> np.ndarray:
    """Attention [..., T, T] with the first key column removed from view and rows renormalised over the rest.
    Most heads park most of their weight on the first token (an 'attention sink'); hiding it shows the rest."""
    m = np.array(maps, dtype=np.float32, copy=True)
    m[..., 0] = 0
    s = m.sum(-1, keepdims=True)
    return np.divide(m, s, out=np.zeros_like(m), where=s > 0)


@shared
def mosaic_image(maps: np.ndarray, cell: int = 64, gap: int = 3) -> np.ndarray:
    """All layers x heads as ONE RGB image: heads down, layers across, each tile one attention map [n, n]
    (viridis, brightness = sqrt(weight / the tile's largest weight), future masked light grey). One picture
    instead of hundreds of heatmaps, so long prompts stay responsive. Short prompts are enlarged pixel by pixel
    (no blur), to at least `cell` pixels a tile."""
    from plotly.colors import sample_colorscale

    L, H, n, _ = maps.shape
    lut = np.array(
        [[int(c[1:][i : i + 2], 16) for i in (0, 2, 4)] for c in [_hex(x) for x in sample_colorscale("Viridis", list(np.linspace(0, 1, 256)))]], dtype=np.uint8
    )
    idx = np.linspace(0, n - 1, min(cell, n)).round().astype(int)
    scale = max(1, -(-cell // len(idx)))
    size = len(idx) * scale
    img = np.full((H * (size + gap) - gap, L * (size + gap) - gap, 3), 255, np.uint8)
    tri = np.triu(np.ones((len(idx), len(idx)), bool), k=1)
    for ly in range(L):
        for h in range(H):
            m = maps[ly, h][np.ix_(idx, idx)].astype(np.float32)
            m = np.sqrt(m / max(float(m.max()), 1e-6))  # per-map contrast, square root: weaker links show too
            tile = lut[(np.clip(m, 0, 1) * 255).astype(int)]
            tile[tri] = 235
            tile = tile.repeat(scale, 0).repeat(scale, 1)
            y, x = h * (size + gap), ly * (size + gap)
            img[y : y + size, x : x + size] = tile
    return img


def _hex(c: str) -> str:
    if c.startswith("#"):
        return c
    r, g, b = [int(float(v)) for v in c[c.index("(") + 1 : c.index(")")].split(",")[:3]]
    return f"#{r:02x}{g:02x}{b:02x}"


@shared
def gqa_figure(n_heads: int, n_kv: int) -> go.Figure:
    group = n_heads // max(1, n_kv)
    fig = go.Figure()
    colors = [BLUE, ORANGE, GREEN, RED, "#CC79A7", "#56B4E9", "#F0E442", "#000000"]
    for h in range(n_heads):
        kv = h // group
        fig.add_trace(
            go.Scatter(
                x=[h, kv * group + (group - 1) / 2],
                y=[1, 0],
                mode="lines",
                line=dict(color=colors[kv % len(colors)], width=2),
                showlegend=False,
                hoverinfo="skip",
            )
        )
    fig.add_trace(
        go.Scatter(
            x=list(range(n_heads)),
            y=[1] * n_heads,
            mode="markers+text",
            text=[f"Q{h}" for h in range(n_heads)],
            textposition="top center",
            marker=dict(size=16, color=[colors[(h // group) % len(colors)] for h in range(n_heads)]),
            showlegend=False,
            hovertemplate="query head %{x}<extra></extra>",
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[k * group + (group - 1) / 2 for k in range(n_kv)],
            y=[0] * n_kv,
            mode="markers+text",
            text=[f"KV{k}" for k in range(n_kv)],
            textposition="bottom center",
            marker=dict(size=22, symbol="square", color=[colors[k % len(colors)] for k in range(n_kv)]),
            showlegend=False,
            hoverinfo="skip",
        )
    )
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False, range=[-0.6, 1.5])
    return _layout(fig, f"Grouped-query attention: {n_heads} query heads share {n_kv} key/value heads ({group} per group)", height=260)


# ---------------------------------------------------------------------------------- layers
