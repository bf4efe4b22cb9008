"""Figures for the decode loop seen from the KV cache (pipeline.generation.steps): one step's newest query over every
cached key, per head, and the cache at that step (what was reused, what was computed)."""

from __future__ import annotations

import plotly.graph_objects as go

from pipeline.common import shared

from .figures import BLUE, GREEN, GREY, ORANGE, RED, _layout
from .tokens import plot_text


@shared
def step_attention_figure(rows, labels: list[str], n_prompt: int, step: int, layer: int) -> go.Figure:
    """One decode step at one layer: each head's newest query (a row) over every cached key (a column, the cached
    token below it). The last column is the new token's own key and value, computed this step; every column before it
    was computed at an earlier step and read back from the KV cache. A line marks where the prompt ends."""
    H, n = rows.shape
    x = list(range(n))
    fig = go.Figure(
        go.Heatmap(
            z=rows,
            x=x,
            y=[f"head {h}" for h in range(H)],
            colorscale="Viridis",
            zmin=0,
            colorbar=dict(title="weight"),
            customdata=[[plot_text(labels[j]) for j in x] for _ in range(H)],
            hovertemplate="%{y}, key %{x} %{customdata}: %{z:.4f}<extra></extra>",
        )
    )
    fig.add_shape(type="rect", x0=n - 1.5, x1=n - 0.5, y0=-0.5, y1=H - 0.5, line=dict(color=RED, width=3))
    if 0 < n_prompt < n:
        fig.add_vline(x=n_prompt - 0.5, line=dict(color=GREY, width=2, dash="dash"))
    every = max(1, -(-n // 40))
    fig.update_xaxes(tickvals=x[::every], ticktext=[plot_text(labels[j]) for j in x[::every]], tickangle=-60)
    fig.update_yaxes(autorange="reversed")
    what = "the prompt's last query (it chooses the first token)" if step == 0 else f"the query of generated token {step}"
    return _layout(fig, f"Step {step}, layer {layer}: {what} over {n} cached keys (red: computed this step)", height=max(300, 40 * H + 170))


@shared
def cache_strip_figure(n_prompt: int, cache_len: int, step: int) -> go.Figure:
    """The KV cache at one step, one cell per cached token: the prompt's (computed by the prefill), the generated
    tokens' (each computed at its own step), all reused now, and the new token's, computed this step."""
    kinds = ["prompt (prefill, reused)"] * n_prompt + ["generated earlier (reused)"] * (cache_len - n_prompt)
    if step > 0:
        kinds[-1] = "new: computed this step"
    else:
        kinds = ["prompt: computed by the prefill, this step"] * cache_len
    colors = {
        "prompt (prefill, reused)": BLUE,
        "generated earlier (reused)": GREEN,
        "new: computed this step": RED,
        "prompt: computed by the prefill, this step": ORANGE,
    }
    fig = go.Figure()
    for k in dict.fromkeys(kinds):
        idx = [i for i, x in enumerate(kinds) if x == k]
        fig.add_trace(go.Bar(x=idx, y=[1] * len(idx), name=k, marker_color=colors[k], hovertemplate="position %{x}<extra>" + k + "</extra>"))
    fig.update_layout(barmode="overlay", bargap=0.1, legend=dict(orientation="h", y=-0.5))
    fig.update_yaxes(visible=False)
    return _layout(fig, f"The KV cache at step {step}: {cache_len} tokens' keys and values, every layer", height=210, xaxis_title="cached position")
