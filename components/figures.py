"""Plotly figures for every stage. Inputs are numpy arrays and lists; no model calls."""

from __future__ import annotations

import threading

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from pipeline.common import shared

from .fmt import prob
from .tokens import plot_text, visible

SEQ = "Viridis"  # perceptually uniform, colour-blind safe


def _white() -> str:
    """Plotly's "plotly_white" for the three trace types drawn here (bar, heatmap, scatter): the same look. The full
    template carries defaults for 24 trace types, validated again whenever a figure takes it or is copied: 8-10 ms a
    figure, a third of a page's run on the attention page (30 followers of a live class rerun a page each)."""
    name = "explorer_white"
    if name not in pio.templates:
        white = pio.templates["plotly_white"]
        data = {k: v for k, v in white.data.to_plotly_json().items() if k in ("bar", "heatmap", "scatter")}
        pio.templates[name] = go.layout.Template(layout=white.layout, data=data)
    return name


TEMPLATE = _white()
BLUE, ORANGE, GREEN, GREY, RED = "#0072B2", "#E69F00", "#009E73", "#BBBBBB", "#D55E00"


def _layout(fig, title=None, height=420, **kw):
    top = 40 if title else 10
    if title and any(a.yanchor == "bottom" and (a.y or 0) >= 0.99 for a in fig.layout.annotations):
        top = 70  # subplot titles sit above the plots: the figure's title goes above them, not across them
    fig.update_layout(title=title, height=height, margin=dict(l=10, r=10, t=top, b=10), template=TEMPLATE, **kw)
    return fig


def log_ticks(values) -> dict:
    """Tick values 1-2-5 per decade spanning `values`, labelled with their magnitude (Plotly's default log
    ticks label minor ticks "2 5" without it)."""
    import math

    vals = [v for v in values if v and v > 0]
    if not vals:
        return {}
    lo, hi = math.floor(math.log10(min(vals))), math.ceil(math.log10(max(vals)))
    ticks = [m * 10**e for e in range(lo, hi + 1) for m in (1, 2, 5) if min(vals) / 2 <= m * 10**e <= max(vals) * 2]
    return dict(tickvals=ticks, ticktext=[f"{t:g}" for t in ticks])


def token_texts(tokens) -> list[str]:
    """Each token as drawn: its text with whitespace made visible (a special token by its piece)."""
    return [visible(t.text if not t.special else t.piece) for t in tokens]


def labels_of(tokens) -> list[str]:
    """Axis labels "position:text" (unique, so a repeated token keeps its own row)."""
    return [plot_text(f"{i}:{s}") for i, s in enumerate(token_texts(tokens))]


# ------------------------------------------------------------------------------ overview
@shared
def timings_bar(timings: dict[str, float]) -> go.Figure:
    """The forward pass's stages (blue, summing exactly to the forward pass: what the hooks cannot attribute is
    its own bar) and the work around it (grey: tokenizing before, the logit-lens read-out after)."""
    ms = {k: v * 1000 for k, v in timings.items() if k not in ("total",)}
    outside = ["tokenize", "logit lens"]
    layer_ms = [v for k, v in ms.items() if k.startswith("layer ")]
    inside = [(k, v) for k, v in ms.items() if k not in outside and k != "forward total" and not k.startswith("layer ")]
    if layer_ms:
        inside.insert(2, (f"{len(layer_ms)} transformer layers", sum(layer_ms)))
    total = ms.get("forward total", sum(v for _, v in inside))
    rest = total - sum(v for _, v in inside)
    if rest > 0:
        inside.append(("between stages (hooks, Python)", rest))
    rows = [(k, v, BLUE) for k, v in inside] + [(f"{k} (outside the forward pass)", ms[k], GREY) for k in outside if k in ms]
    fig = go.Figure(
        go.Bar(
            x=[v for _, v, _ in rows],
            y=[k for k, _, _ in rows],
            orientation="h",
            marker_color=[c for _, _, c in rows],
            text=[f"{v:.1f} ms" for _, v, _ in rows],
            textposition="auto",
        )
    )
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, f"Where the time went (this run): the blue bars make the {total:.0f} ms forward pass", height=320, xaxis_title="milliseconds")


# ---------------------------------------------------------------------------- embeddings
SPOTS = {  # textposition -> where its label box sits relative to the point, in label widths / heights
    "top center": (-0.5, 0.3),
    "bottom center": (-0.5, -1.3),
    "middle right": (0.1, -0.5),
    "middle left": (-1.1, -0.5),
    "top right": (0.05, 0.2),
    "top left": (-1.05, 0.2),
    "bottom right": (0.05, -1.2),
    "bottom left": (-1.05, -1.2),
}


def place_labels(
    x, y, labels, width: float = 900, height: float = 420, font: float = 15, log_x: bool = False, log_y: bool = False, drop: bool = False
) -> list[str | None]:
    """A textposition per point so that labels avoid each other and the points: greedy, each label takes the spot
    around its point whose box (estimated at 0.6 em a character) overlaps least with the labels placed before it
    and with every point. The plot area is taken as `width` x `height` px. With `drop`, a label that finds no free
    spot, or repeats the same label at the same place, gets None: no text (its hover still names it)."""
    px = np.log10(np.maximum(np.asarray(x, float), 1e-30)) if log_x else np.asarray(x, float)
    py = np.log10(np.maximum(np.asarray(y, float), 1e-30)) if log_y else np.asarray(y, float)
    if len(px) == 0:
        return []
    span = lambda v: (v.max() - v.min()) or 1.0  # noqa: E731
    X, Y = (px - px.min()) / span(px) * width, (py - py.min()) / span(py) * height
    boxes, out = [], []
    dots = [(X[i] - 4, Y[i] - 4, X[i] + 4, Y[i] + 4) for i in range(len(X))]

    def overlap(a, b):
        return max(0.0, min(a[2], b[2]) - max(a[0], b[0])) * max(0.0, min(a[3], b[3]) - max(a[1], b[1]))

    def box(i, spot, w, h):
        dx, dy = SPOTS[spot]
        return (X[i] + dx * w, Y[i] + dy * h, X[i] + (dx + 1) * w, Y[i] + (dy + 1) * h)

    def cost(i, spot, w, h):
        b = box(i, spot, w, h)
        outside = (b[0] < 0 or b[2] > width) * w * h  # a label off the plot's side is as bad as one covered
        return sum(overlap(o, b) for o in boxes + dots) + outside

    seen = set()
    for i in np.argsort(X):
        w, h = 0.6 * font * max(1, len(str(labels[i]))), font * 1.2
        best = min(SPOTS, key=lambda s: cost(i, s, w, h))
        same = (str(labels[i]), round(X[i]), round(Y[i]))
        if drop and (same in seen or cost(i, best, w, h) > 0.05 * w * h):
            out.append((i, None))
            continue
        seen.add(same)
        boxes.append(box(i, best, w, h))
        out.append((i, best))
    return [s for _, s in sorted(out)]


PCA_LABELS = 160  # the PCA's text labels: the reference words and the prompt's last tokens (every point has its hover)


@shared
def pca_figure(coords: np.ndarray, labels: list[str], groups: list[str], dims: int = 2, var: np.ndarray | None = None) -> go.Figure:
    colors = {"prompt": BLUE, "reference": ORANGE}
    fig = go.Figure()
    spots: list = [None] * len(labels)
    refs = [i for i, g in enumerate(groups) if g != "prompt"]
    room = max(0, PCA_LABELS - len(refs))
    keep = sorted(set(refs) | set([i for i, g in enumerate(groups) if g == "prompt"][len(groups) - len(refs) - room :] if room else []))
    if dims == 2:  # labels that avoid each other (a greedy placement, quadratic in the labels: at most PCA_LABELS of them)
        placed = place_labels(coords[keep, 0], coords[keep, 1], [labels[i] for i in keep], drop=True)
        for i, spot in zip(keep, placed):
            spots[i] = spot
    shown = set(keep)
    for g in dict.fromkeys(groups):
        idx = [i for i, x in enumerate(groups) if x == g]
        kw = dict(
            mode="markers+text",
            name=g,
            text=[labels[i] if (dims == 3 and i in shown) or spots[i] else "" for i in idx],
            hovertext=[labels[i] for i in idx],
            hoverinfo="text",
            textposition=[spots[i] or "top center" for i in idx] if dims == 2 else "top center",
            marker=dict(size=8, color=colors.get(g, GREEN)),
        )
        if dims == 3:
            fig.add_trace(go.Scatter3d(x=coords[idx, 0], y=coords[idx, 1], z=coords[idx, 2], **kw))
        else:
            fig.add_trace(go.Scatter(x=coords[idx, 0], y=coords[idx, 1], **kw))
    v = var if var is not None else np.zeros(3)
    names = [f"PC{i + 1} ({v[i] * 100:.0f}% var)" if i < len(v) else f"PC{i + 1}" for i in range(3)]
    if dims == 3:
        fig.update_layout(scene=dict(xaxis_title=names[0], yaxis_title=names[1], zaxis_title=names[2]))
    else:
        fig.update_xaxes(title=names[0])
        fig.update_yaxes(title=names[1])
    return _layout(fig, f"Token embeddings projected to {dims}D (PCA)", height=480)


@shared
def vector_strip(vec: np.ndarray, title: str) -> go.Figure:
    fig = go.Figure(go.Heatmap(z=vec[None, :], colorscale="RdBu", zmid=0, showscale=True, hovertemplate="dim %{x}: %{z:.4f}<extra></extra>"))
    fig.update_yaxes(visible=False)
    return _layout(fig, title, height=140, xaxis_title="dimension")


def layer_labels(n_states: int) -> list[str]:
    """Names of the residual-stream states: the embeddings, then after layer 0, 1, ... (layers count from 0
    everywhere in this app)."""
    return ["emb"] + [str(i) for i in range(n_states - 1)]


def _residual_axis(fig, n_states: int, title: str = "after layer (emb = the embeddings, before layer 0)"):
    """x positions -1 (embeddings), 0 .. L-1 (after that layer), labelled so that layer numbers match."""
    step = max(1, n_states // 15)
    vals = [-1] + list(range(0, n_states - 1, step))
    fig.update_xaxes(title=title, tickvals=vals, ticktext=["emb" if v < 0 else str(v) for v in vals])


@shared
def drift_figure(curves: dict[str, np.ndarray], title: str) -> go.Figure:
    """Cosine similarity after each layer (and at the embeddings), one line per compared token; the y range
    fits the data so that small drifts are visible."""
    fig = go.Figure()
    lo = min(float(np.min(c)) for c in curves.values())
    for (name, cos), color in zip(curves.items(), [BLUE, ORANGE, GREEN, RED]):
        fig.add_trace(go.Scatter(x=np.arange(len(cos)) - 1, y=cos, mode="lines+markers", name=name, line=dict(color=color)))
    pad = max(0.005, (1 - lo) * 0.1)
    fig.update_yaxes(title="cosine similarity", range=[max(-1.0, lo - pad), 1 + pad / 2])
    _residual_axis(fig, len(next(iter(curves.values()))))
    return _layout(fig, title, height=380)


@shared
def rope_heatmap(angles: np.ndarray) -> go.Figure:
    fig = go.Figure(
        go.Heatmap(
            z=np.cos(angles).T,
            colorscale="RdBu",
            zmid=0,
            colorbar=dict(title="cos θ"),
            hovertemplate="position %{x}, pair %{y}: cos θ = %{z:.3f}<extra></extra>",
        )
    )
    fig.update_xaxes(title="position")
    fig.update_yaxes(title="frequency pair (fast → slow)")
    return _layout(fig, "RoPE: rotation of each 2-D pair, by position", height=380)


@shared
def relative_figure(scores: np.ndarray, shifted: np.ndarray | None = None) -> go.Figure:
    d = np.arange(len(scores))
    fig = go.Figure(go.Scatter(x=d, y=scores, mode="lines", name="query at position d, key at 0", line=dict(color=BLUE)))
    if shifted is not None:
        fig.add_trace(go.Scatter(x=d, y=shifted, mode="markers", name="both shifted by +100 (same curve)", marker=dict(color=ORANGE, size=4)))
    fig.update_xaxes(title="relative distance (tokens)")
    fig.update_yaxes(title="query · key score")
    return _layout(fig, "A query-key score depends on relative distance only", height=360)


@shared
def learned_positions_figure(pos_emb: np.ndarray) -> go.Figure:
    fig = go.Figure(go.Heatmap(z=pos_emb, colorscale="RdBu", zmid=0))
    fig.update_xaxes(title="dimension")
    fig.update_yaxes(title="position")
    return _layout(fig, "Learned position embeddings", height=380)


# ------------------------------------------------------------------------------ attention
@shared
def matrix_heatmap(z: np.ndarray, x: list[str], y: list[str], title: str, zmid=None, colorscale="RdBu", height=360) -> go.Figure:
    fig = go.Figure(go.Heatmap(z=z, x=x, y=y, colorscale=colorscale, zmid=zmid, hovertemplate="%{y} · %{x}: %{z:.3f}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", tickfont=dict(size=9), type="category")
    fig.update_xaxes(tickfont=dict(size=9), type="category")  # labels stay labels, even "0", "1", ...
    return _layout(fig, title, height=height)


@shared
def residual_figure(resid: np.ndarray, attn: np.ndarray, ffn: np.ndarray, position_label: str) -> go.Figure:
    L = len(attn)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=list(range(-1, L)), y=resid, name="|residual stream| after the layer", mode="lines+markers", line=dict(color=BLUE)))
    fig.add_trace(go.Bar(x=list(range(L)), y=attn, name="|attention adds|", marker_color=ORANGE, opacity=0.85))
    fig.add_trace(go.Bar(x=list(range(L)), y=ffn, name="|feed-forward adds|", marker_color=GREEN, opacity=0.85))
    fig.update_layout(barmode="group")
    _residual_axis(fig, L + 1, "layer (emb = the embeddings, before layer 0)")
    fig.update_yaxes(title="L2 norm (log scale)", type="log", dtick=1)
    return _layout(fig, f"Residual stream and what each sub-layer adds · token {position_label}", height=420)


@shared
def norm_effect_figure(resid: np.ndarray, normed: np.ndarray) -> go.Figure:
    L = len(normed)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=list(range(L)), y=resid[:L], name="residual entering the layer", mode="lines+markers", line=dict(color=BLUE)))
    fig.add_trace(go.Scatter(x=list(range(L)), y=normed, name="after the layer's norm (what attention reads)", mode="lines+markers", line=dict(color=RED)))
    fig.update_xaxes(title="layer")
    fig.update_yaxes(title="L2 norm (log scale)", type="log", dtick=1)
    return _layout(fig, "The norm rescales the growing residual before attention reads it", height=340)


@shared
def lens_figure(ids: np.ndarray, probs: np.ndarray, texts: list[list[str]], col_labels: list[str]) -> go.Figure:
    L1, P = probs.shape
    fig = go.Figure(
        go.Heatmap(
            z=probs,
            x=col_labels,
            y=layer_labels(L1),
            colorscale=SEQ,
            zmin=0,
            zmax=1,
            text=texts,
            texttemplate="%{text}" if P <= 24 else None,
            textfont=dict(size=9),
            colorbar=dict(title="p(top)"),
            hovertemplate="after layer %{y}, at %{x}<br>top: %{text}  p=%{z:.3f}<extra></extra>",
        )
    )
    fig.update_yaxes(autorange="reversed", title="after layer (emb = embeddings)", type="category")
    fig.update_xaxes(tickangle=-45, tickfont=dict(size=9 if P <= 32 else 7), type="category", dtick=1)  # every position's token
    return _layout(fig, "Logit lens: the model's best guess for the NEXT token if it stopped after each layer", height=max(420, 18 * L1 + 120))


# ------------------------------------------------------------------------------- sampling
@shared
def sampling_figure(cands: list[str], stages: list[tuple[str, np.ndarray]], tokens: list[tuple[int, str]] | None = None) -> go.Figure:
    """Bars per filter stage for the top candidates: probability after each stage, zero = filtered out. `tokens`:
    each candidate's (id, text), kept with the bars (the export's numbers name them apart from the labels)."""
    fig = make_subplots(rows=1, cols=len(stages), shared_yaxes=True, subplot_titles=[name for name, _ in stages], horizontal_spacing=0.02)
    for j, (name, p) in enumerate(stages):
        colors = [BLUE if v > 0 else GREY for v in p]
        fig.add_trace(
            go.Bar(
                x=p,
                y=cands,
                orientation="h",
                marker_color=colors,
                showlegend=False,
                name=name,
                customdata=[[i, t] for i, t in tokens] if tokens else None,
                meta={"columns": ["token id", "token"]} if tokens else None,
                text=[_pfmt(v) for v in p],
                textposition="outside",
                cliponaxis=False,
                hovertemplate="%{y}: %{x:.4f}<extra>" + name + "</extra>",
            ),
            row=1,
            col=j + 1,
        )
        fig.update_xaxes(range=[0, 1.4], row=1, col=j + 1, showticklabels=False)  # room for "1.000" at 18 px beside a full bar (1.15 cut it at 1280 px)
    fig.update_yaxes(autorange="reversed", tickfont=dict(size=11))
    _layout(fig, "The next token's probabilities after each filter (✗: filtered out)", height=max(320, 26 * len(cands) + 130))
    fig.update_layout(margin=dict(t=90))  # room above the stage titles for the figure's: the toolbar never covers one
    return fig


def _pfmt(v: float) -> str:
    return "✗" if v <= 0 else prob(v)


_COPYING = threading.Lock()


def copy_figure(fig: go.Figure) -> go.Figure:
    """A copy of a figure that other visitors' threads may be copying at the same moment (memo.shared's figures and
    views.ready's page copies are one object for the whole server). Plotly's constructor takes each source trace's
    `type` out of that trace's own properties while it copies and puts it back after (validate_coerce's pop), so two
    threads copying one figure at once built scatter traces from bar and heatmap properties: "Invalid property
    specified for object of type Scatter: 'colorscale'" on two of 30 followers' pages in a live class bench
    (2026-12-04). Every copy of a figure goes through here, one at a time."""
    with _COPYING:
        return (go.Figure if isinstance(fig, FrozenFigure) else type(fig))(fig)


class FrozenFigure(go.Figure):
    """A figure nobody changes any more (views.ready's page copy, drawn by every session showing the view): its
    dictionary (Plotly's to_dict: a deep copy of every trace and the arrays' base64, what st.plotly_chart asks for on
    every run; a fifth of a follower's run on the attention page) is made once and handed out as it is. Its readers
    only read it (Streamlit's plotly_chart encodes it); a copy (copy_figure) is a plain go.Figure again."""

    def to_dict(self):
        got = self.__dict__.get("_frozen_dict")
        if got is None:
            got = self.__dict__["_frozen_dict"] = super().to_dict()
        return got


def frozen(fig: go.Figure) -> go.Figure:
    """`fig` (a plain go.Figure nobody will change again), as a FrozenFigure; any other figure as it is."""
    if type(fig) is go.Figure:
        fig.__class__ = FrozenFigure
    return fig


def clickable_cells(fig: go.Figure) -> go.Figure:
    """A copy of a one-heatmap figure that can be clicked cell by cell in the page: Plotly selects no heatmap
    cell on click, so an invisible square marker sits on every cell, carrying its (row, column) as customdata
    and the heatmap's hover text, and the nearest one is picked wherever the click lands. For the page only:
    the exported figure is the original."""
    f = copy_figure(fig)
    hm = next(t for t in f.data if t.type == "heatmap")
    z = np.asarray(hm.z, dtype=float)
    rows, cols = z.shape
    xs = list(hm.x) if hm.x is not None else list(range(cols))
    ys = list(hm.y) if hm.y is not None else list(range(rows))
    cells = [(r, c) for r in range(rows) for c in range(cols)]
    f.add_trace(
        go.Scatter(
            x=[xs[c] for _, c in cells],
            y=[ys[r] for r, _ in cells],
            customdata=[[r, c, z[r, c]] for r, c in cells],
            mode="markers",
            marker=dict(symbol="square", size=14, opacity=0),
            selected=dict(marker=dict(opacity=0)),
            unselected=dict(marker=dict(opacity=0)),
            hovertemplate=(hm.hovertemplate or "%{y} %{x}: %{z:.3g}<extra></extra>").replace("%{z", "%{customdata[2]"),
            showlegend=False,
            name="click target",
        )
    )
    hm.update(hoverinfo="skip", hovertemplate=None)
    f.update_layout(hoverdistance=-1, clickmode="event+select", dragmode=False)
    return f
