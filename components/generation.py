"""Figures for the autoregressive loop, prefill vs decode, the KV cache and hardware telemetry."""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from pipeline.common import shared
from pipeline.generation import CacheMode, Phase

from .figures import BLUE, GREEN, GREY, ORANGE, RED, _layout, log_ticks, place_labels
from .tokens import lit, plot_text, visible


@shared
def step_times_figure(events, title="Time per generated token (this run)") -> go.Figure:
    """Each token's own pass; under token 0, in grey, the time before its prefill began (tokenizing, the engine's
    line, a fresh server's setup), so the first bar's height is the time to first token shown beside it."""
    x = [e.index for e in events]
    y = [e.step_s * 1000 for e in events]
    colors = [ORANGE if e.phase == Phase.PREFILL else BLUE for e in events]
    fig = go.Figure()
    before = (events[0].t_s - min(events[0].step_s, events[0].t_s)) * 1000 if events else 0.0
    if before >= 0.5:
        fig.add_trace(
            go.Bar(
                x=[x[0]],
                y=[before],
                marker_color=GREY,
                name="before the prefill (tokenizing, waiting, setup)",
                text=[f"{before:,.0f} ms before"],
                hovertemplate="before the prefill: %{y:.1f} ms<extra></extra>",
            )
        )
    fig.add_trace(
        go.Bar(
            x=x,
            y=y,
            marker_color=colors,
            name="the token's own pass",
            customdata=[plot_text(visible(e.text)) for e in events],
            text=[plot_text(visible(e.text)) for e in events] if len(events) <= 32 else None,
            hovertemplate="token %{x}: %{customdata}<br>%{y:.1f} ms<extra></extra>",
        )
    )
    fig.update_layout(barmode="stack", showlegend=before >= 0.5, legend=dict(orientation="h", y=-0.3, yanchor="top"))
    fig.update_xaxes(title="generated token (0 = first token: prefill, orange; grey under it: before the prefill)")
    fig.update_yaxes(title="milliseconds")
    return _layout(fig, title, height=340)


SUB = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")


def token_labels(events) -> list[str]:
    """A button label per generated token (Markdown-safe): its text with whitespace made visible (a byte piece
    as <0xE6>, see pipeline.forward.tokens.text_of), and its position as a subscript."""
    return [f"{lit(visible(e.text)) or '∅'} {str(i).translate(SUB)}" for i, e in enumerate(events)]


@shared
def distribution_figure(ev) -> go.Figure:
    """The step's top candidates after and before the filters; the drawn token (red) is always shown."""
    chosen = ev.token_id
    top, top_raw = list(ev.top), list(ev.top_raw)
    if chosen not in [i for i, _, _ in top]:
        top.append((chosen, ev.text, ev.p))
    if chosen not in [i for i, _, _ in top_raw]:
        top_raw.append((chosen, ev.text, ev.p_raw))
    fig = make_subplots(rows=1, cols=2, subplot_titles=["after the filters (drawn from)", "before (softmax)"], horizontal_spacing=0.18)
    for col, rows in ((1, top), (2, top_raw)):
        fig.add_trace(
            go.Bar(
                x=[p for _, _, p in rows],
                y=[plot_text(f"{visible(t)!r}") for _, t, _ in rows],
                orientation="h",
                marker_color=[RED if i == chosen else BLUE for i, _, _ in rows],
                showlegend=False,
                text=[f"{p:.3f}" for _, _, p in rows],
                textposition="outside",
                cliponaxis=False,
            ),
            row=1,
            col=col,
        )
        fig.update_xaxes(range=[0, 1.15], row=1, col=col)
    fig.update_yaxes(autorange="reversed")
    _layout(fig, None, height=max(260, 24 * max(len(top), len(top_raw)) + 80))
    fig.update_layout(margin=dict(t=40))
    return fig


def _bars(samples, scale: float = 1000.0) -> dict:
    """Plotly error bars from the median up to the highest repeat and down to the lowest."""
    return dict(
        type="data", symmetric=False, array=[(x.hi - x.median) * scale for x in samples], arrayminus=[(x.median - x.lo) * scale for x in samples], thickness=1.5
    )


@shared
def sweep_figure(rows) -> go.Figure:
    fig = go.Figure()
    T = [r.tokens for r in rows]
    for attr, name, color in (
        ("prefill", "prefill: the whole prompt at once (= time to first token)", ORANGE),
        ("decode", "decode: one more token with the KV cache", BLUE),
    ):
        s = [getattr(r, attr) for r in rows]
        fig.add_trace(go.Scatter(x=T, y=[x.median * 1000 for x in s], error_y=_bars(s), mode="lines+markers", name=name, line=dict(color=color)))
    fig.update_xaxes(title="prompt length (tokens)", type="log", tickvals=T)
    vals = [v * 1000 for r in rows for x in (r.prefill, r.decode) for v in x.values]
    fig.update_yaxes(title="milliseconds (log scale)", type="log", **log_ticks(vals))
    return _layout(fig, "Prefill and one decode step, by prompt length (median, bars: every repeat's range)", height=380, legend=dict(orientation="h", y=-0.25))


@shared
def cache_on_off_figure(rows) -> go.Figure:
    """The prefill/decode page's cache experiment: the mean decode step with and without the KV cache at each context length."""
    fig = go.Figure()
    T = [r.tokens for r in rows]
    for attr, name, color in (("on", "KV cache on: each step feeds 1 token", BLUE), ("off", "cache off: each step re-reads the whole context", RED)):
        s = [getattr(r, attr) for r in rows]
        fig.add_trace(go.Scatter(x=T, y=[x.median * 1000 for x in s], error_y=_bars(s), mode="lines+markers", name=name, line=dict(color=color)))
    fig.update_xaxes(title="context length (tokens)", tickvals=T)
    fig.update_yaxes(title="decode step time (ms)")
    return _layout(fig, "A decode step with and without the KV cache (median, bars: every repeat's range)", height=380, legend=dict(orientation="h", y=-0.25))


@shared
def kv_growth_figure(events, formula) -> go.Figure:
    """formula(tokens) -> bytes, drawn as a line under the measured points."""
    fig = go.Figure()
    fig.add_trace(
        go.Scatter(
            x=[e.context_len for e in events],
            y=[e.kv_bytes / 2**20 for e in events],
            mode="markers",
            name="measured: bytes of the cache tensors",
            marker=dict(color=BLUE, size=7),
        )
    )
    fig.add_trace(
        go.Scatter(
            x=[e.context_len for e in events],
            y=[formula(e.context_len) / 2**20 for e in events],
            mode="lines",
            name="formula",
            line=dict(color=ORANGE, dash="dot"),
        )
    )
    fig.update_xaxes(title="tokens in the context")
    fig.update_yaxes(title="MiB", rangemode="tozero")
    return _layout(fig, "KV cache size over the run", height=340, legend=dict(orientation="h", y=-0.3))


@shared
def kv_layers_figure(per_layer: list[int]) -> go.Figure:
    fig = go.Figure(go.Bar(x=list(range(len(per_layer))), y=[b / 2**10 for b in per_layer], marker_color=GREEN))
    fig.update_xaxes(title="layer")
    fig.update_yaxes(title="KiB (keys + values)")
    return _layout(fig, "Per layer, at the end of the run", height=300)


@shared
def telemetry_figure(tl) -> go.Figure:
    s = tl.samples
    t = [x["t"] for x in s]
    gpu = tl.source == "nvml"
    fig = make_subplots(
        rows=2,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=["GPU utilisation %" if gpu else "CPU % of this process (100 = one core)", "GPU memory used (MiB)" if gpu else "resident memory (MiB)"],
    )
    if gpu:
        fig.add_trace(go.Scatter(x=t, y=[x["gpu_util"] for x in s], name="NVML polled", line=dict(color=BLUE)), 1, 1)
        if tl.nvml_util:
            fig.add_trace(
                go.Scatter(
                    x=[a for a, _ in tl.nvml_util],
                    y=[b for _, b in tl.nvml_util],
                    mode="markers",
                    name="NVML buffered samples",
                    marker=dict(color=GREEN, size=5),
                ),
                1,
                1,
            )
        fig.add_trace(go.Scatter(x=t, y=[x["mem_used_mb"] for x in s], name="memory used", line=dict(color=ORANGE)), 2, 1)
    else:
        fig.add_trace(go.Scatter(x=t, y=[x["cpu_percent"] for x in s], name="process CPU %", line=dict(color=BLUE)), 1, 1)
        n = len(s[0]["per_core"]) if s and "per_core" in s[0] else 0
        for c in range(n):
            fig.add_trace(go.Scatter(x=t, y=[x["per_core"][c] for x in s], name=f"core {c} (whole machine)", line=dict(width=1, dash="dot")), 1, 1)
        fig.add_trace(go.Scatter(x=t, y=[x["rss_mb"] for x in s], name="RSS", line=dict(color=ORANGE)), 2, 1)
    fig.update_yaxes(rangemode="tozero", row=2, col=1)
    for a, b, label in tl.marks:
        fig.add_vrect(
            x0=a, x1=b, fillcolor=ORANGE if label == Phase.PREFILL else GREY, opacity=0.25 if label == Phase.PREFILL else 0.12, line_width=0, row="all", col=1
        )
    fig.update_xaxes(title="seconds since the request", row=2, col=1)
    _layout(fig, "Hardware during the run (orange = prefill, grey = decode steps)", height=540)
    fig.update_layout(margin=dict(t=80))
    return fig


@shared
def ops_figure(top) -> go.Figure:
    fig = go.Figure(
        go.Bar(
            x=[r.share * 100 for r in top],
            y=[r.op for r in top],
            error_x=dict(
                type="data", symmetric=False, array=[max(0.0, (r.hi - r.share) * 100) for r in top], arrayminus=[max(0.0, (r.share - r.lo) * 100) for r in top]
            ),
            orientation="h",
            marker_color=[BLUE if r.matmul else GREY for r in top],
            hovertemplate="%{y}: %{x:.1f}%<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed")
    fig.update_xaxes(title="% of a decode step's operator time (median; bars: range over the repeats)")
    return _layout(fig, "Where a decode step's time goes (blue = matrix multiplication)", height=380)


@shared
def kernels_figure(rows) -> go.Figure:
    """Prefill time and peak memory per attention kernel over prompt lengths, with the T x T score matrix."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=["prefill time (s)", "peak extra memory (MiB)"], horizontal_spacing=0.1)
    colors = [RED, BLUE, GREEN, ORANGE, "#CC79A7"]
    kernels = list(dict.fromkeys(r.kernel for r in rows))
    for k, color in zip(kernels, colors):
        rs = [r for r in rows if r.kernel == k and r.seconds is not None]
        x = [r.tokens for r in rs]
        bars = _bars([r.runs for r in rs], 1.0) if all(r.runs is not None for r in rs) else None
        fig.add_trace(go.Scatter(x=x, y=[r.seconds for r in rs], error_y=bars, name=k, mode="lines+markers", line=dict(color=color), legendgroup=k), 1, 1)
        fig.add_trace(
            go.Scatter(
                x=x, y=[r.peak_mb if r.peak_mb > 0 else None for r in rs], name=k, mode="lines+markers", line=dict(color=color), legendgroup=k, showlegend=False
            ),
            1,
            2,
        )
    T = sorted({r.tokens for r in rows})
    mat = {r.tokens: r.score_matrix_mb for r in rows}
    fig.add_trace(go.Scatter(x=T, y=[mat[t] for t in T], name="one layer's T×T scores (fp32)", mode="lines", line=dict(color=GREY, dash="dash")), 1, 2)
    fig.update_xaxes(type="log", tickvals=T, title="prompt tokens")
    ok = [r for r in rows if r.seconds is not None]
    fig.update_yaxes(type="log", row=1, col=1, **log_ticks([r.seconds for r in ok]))
    fig.update_yaxes(type="log", row=1, col=2, **log_ticks([r.peak_mb for r in ok] + list(mat.values())))
    fig = _layout(fig, "Attention kernels: whole-model prefill on this device", height=440, legend=dict(orientation="h", y=-0.25))
    fig.update_layout(margin=dict(t=90))  # the figure title above the two subplot titles
    return fig


def _rows(items: list, n: int) -> list[list]:
    return [items[i : i + n] for i in range(0, len(items), n)]


@shared
def roofline_figure(r) -> go.Figure:
    """Log-log roofline: attainable FLOP/s = min(peak, bandwidth x intensity); each op at its intensity and
    its measured FLOP/s (prefill orange, decode blue)."""
    import numpy as np

    peak, bw = r.peak_flops, r.bandwidth
    ops = [o for ph in r.phases.values() for o in ph.ops]
    xs = [o.intensity for o in ops]
    lo, hi = min(xs + [r.ridge]) / 3, max(xs + [r.ridge]) * 3
    grid = np.logspace(np.log10(lo), np.log10(hi), 200)
    fig = go.Figure(go.Scatter(x=grid, y=np.minimum(peak, bw * grid) / 1e9, mode="lines", name="roofline (measured peaks)", line=dict(color=GREY, width=3)))
    every = [(phase, o) for phase in Phase for o in r.phases[phase].ops]
    number = {op: n for n, op in enumerate(dict.fromkeys(o.op for _, o in every), 1)}  # one number per operation, both phases
    text, spots = _point_labels(every, number)
    for phase, color in ((Phase.PREFILL, ORANGE), (Phase.DECODE, BLUE)):
        ph = r.phases[phase].ops
        fig.add_trace(
            go.Scatter(
                x=[o.intensity for o in ph],
                y=[o.flops / o.measured_s / 1e9 for o in ph],
                mode="markers+text",  # every point numbered on the figure, the numbers' key under it: no hover needed
                textposition=[spots.get(id(o), "top center") for o in ph],
                textfont=dict(color=color),
                name=str(phase),
                marker=dict(color=color, size=10),
                text=[text[id(o)] for o in ph],
                cliponaxis=False,  # a number by a point at the plot's edge stays whole
                customdata=[o.op for o in ph],
                hovertemplate="%{customdata}<br>%{x:.2f} FLOP/byte<br>%{y:.1f} GFLOP/s measured<extra>" + phase + "</extra>",
            )
        )
    _roofline_notes(fig, r, every, number)
    fig.update_xaxes(type="log", title="arithmetic intensity (FLOPs per byte moved)", range=[np.log10(lo), np.log10(hi)], dtick=1, tickformat="~g")
    ys = [o.flops / o.measured_s / 1e9 for _, o in every if o.measured_s > 0 and o.flops > 0] + [peak / 1e9]
    # a decade of headroom over the highest point: its number stays under the legend, not behind it
    y_range = [np.log10(min(ys) / 3), np.log10(max(ys) * 10)]
    fig.update_yaxes(type="log", title="GFLOP/s", dtick=1, tickformat="~g", range=y_range)
    fig = _layout(
        fig, "Roofline of one layer and the LM head on this device", height=540, legend=dict(orientation="h", x=1, xanchor="right", y=1.0, yanchor="bottom")
    )
    fig.update_layout(margin=dict(t=60, b=130))  # the legend above the plot, the numbers' key under it
    return fig


def _point_labels(every: list, number: dict) -> tuple[dict, dict]:
    """Each point's label on the roofline ({id(op): text}) and where it goes ({id(op): text position}). Points of one
    phase closer than a tenth of a decade share one label ("2,3,4"): numbers a few pixels apart cannot all be read,
    however they are placed."""
    import numpy as np

    text, lead = {}, []
    for phase, o in every:
        at = (np.log10(o.intensity), np.log10(o.flops / o.measured_s))
        near = next((m for m in lead if m[0] is not o and m[2] == phase and abs(m[1][0] - at[0]) < 0.1 and abs(m[1][1] - at[1]) < 0.1), None)
        if near is None:
            lead.append((o, at, phase))
            text[id(o)] = str(number[o.op])
        else:
            text[id(near[0])] += f",{number[o.op]}"
            text[id(o)] = ""
    placed = place_labels(
        [10 ** m[1][0] for m in lead], [10 ** m[1][1] for m in lead], [text[id(m[0])] for m in lead], log_x=True, log_y=True, height=260, font=18
    )
    return text, {id(m[0]): s for m, s in zip(lead, placed)}


def _roofline_notes(fig: go.Figure, r, every: list, number: dict) -> None:
    """The ridge line, a note when points lie above the memory roof, and the numbers' key under the plot."""
    import numpy as np

    fig.add_vline(x=r.ridge, line_dash="dot", line_color=RED)
    # annotations on a log axis take log10 coordinates (add_vline's own annotation is lost there)
    fig.add_annotation(
        x=np.log10(r.ridge), y=1, yref="paper", text=f"ridge {r.ridge:.1f} FLOP/byte", showarrow=False, xanchor="right", yanchor="top", font=dict(color=RED)
    )
    roof_at = [r.bandwidth * o.intensity for _, o in every]
    above = [o for (_, o), roof in zip(every, roof_at) if o.flops / o.measured_s > roof * 1.05 and o.intensity < r.ridge]
    note = dict(xref="paper", yref="paper", xanchor="left", yanchor="top", showarrow=False, align="left")  # text boxes on the plot
    if above:  # said on the figure, not only in the page's caption
        fig.add_annotation(
            x=0.01,
            y=0.99,
            text=f"{len(above)} point{'s' if len(above) > 1 else ''} above the memory roof: their operands came<br>from the CPU's caches, faster than the main-memory copy that sets the roof",
            **note,
        )
    # the numbers' key, in pixels under the plot: past the tick labels and the axis title, whatever the figure's height
    key = "<br>".join("   ".join(f"<b>{n}</b> {op}" for op, n in row) for row in _rows(list(number.items()), 6))
    fig.add_annotation(x=0, y=0, yshift=-78, text=key, **note)


MODE_LABELS = {
    CacheMode.DYNAMIC: "dynamic cache (transformers)",
    CacheMode.STATIC: "static cache (transformers)",
    CacheMode.FUSED: "fused step",
    CacheMode.FUSED_COMPILE: "fused step, torch.compile",
}
MODE_COLORS = {CacheMode.DYNAMIC: BLUE, CacheMode.STATIC: GREEN, CacheMode.FUSED: ORANGE, CacheMode.FUSED_COMPILE: RED}


@shared
def cache_modes_figure(results: dict) -> go.Figure:
    """Per-step decode time of each mode ({mode: ModeRun}), same request."""
    fig = go.Figure()
    for m, r in results.items():
        ev = r.events
        name = MODE_LABELS.get(m, m) + (f" ({r.engine.mode})" if CacheMode(m).fused else "")
        fig.add_trace(
            go.Scatter(x=[e.index for e in ev[1:]], y=[e.step_s * 1000 for e in ev[1:]], mode="lines", name=name, line=dict(color=MODE_COLORS.get(m, GREY)))
        )
    fig.update_xaxes(title="decode step")
    fig.update_yaxes(title="ms per step", rangemode="tozero")
    return _layout(fig, "Decode step time per mode, same request", height=360, legend=dict(orientation="h", y=-0.3))


@shared
def launches_figure(counts) -> go.Figure:
    """Operators (and on a GPU, kernels) one decode step dispatches, transformers' forward vs the fused step."""
    names = ["transformers forward", "fused step"]
    keys = ["transformers", "fused"]
    fig = go.Figure()
    series = [(counts.ops, "operators dispatched", GREY), (counts.compute_ops, "of which compute (not views)", BLUE)]
    if counts.kernels:
        series.append((counts.kernels, "GPU kernels launched", ORANGE))
    for per, name, color in series:
        ys = [per[k] for k in keys]
        fig.add_trace(go.Bar(x=names, y=ys, name=name, marker_color=color, text=ys, textposition="outside"))
    fig.update_yaxes(title="per decode step", rangemode="tozero")
    return _layout(fig, "What one decode step asks of the host (counted by torch.profiler)", height=340, barmode="group", legend=dict(orientation="h", y=-0.25))


def cache_modes_table(res, util_col: str):
    """Page 12's table of a CacheModeComparison: one row per mode (its speed, its ratio to the dynamic cache with the
    repeats' range, the K/V memory it set aside, the device's utilisation, whether its greedy tokens agree)."""
    import pandas as pd

    return pd.DataFrame(
        [
            {
                "mode": MODE_LABELS.get(m, m),
                "ran as": str(r.engine),
                "tok/s": None if not r.tokens_per_s else round(r.tokens_per_s, 1),
                "runs": " / ".join(f"{x:.1f}" for x in r.runs),
                "× dynamic (median, range)": "1 (the reference)" if m == CacheMode.DYNAMIC else str(res.ratios(m)),
                "KV MiB set aside": round(r.events[-1].kv_reserved_bytes / 2**20, 2),
                util_col: None if r.utilisation is None else round(r.utilisation),
                "warm-up s": round(r.warmup_s, 2),
                "same tokens": res.same_tokens(m),
            }
            for m, r in res.modes.items()
        ]
    )
