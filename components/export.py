"""Figures and tables for slides: SVG and high-resolution PNG through kaleido, a whole page as a ZIP.

    png = image(fig, "png")                                    # 3x, labels kept inside the canvas
    data = page_zip("3-attention_why-is-the-sky-blue", figures=[("heads", fig)], tables={"scores": df}, html={})

kaleido drives a headless Chromium; one is started for the process on the first export and kept (the first
export takes seconds, later ones a fraction of a second). Exports are serialised: one Chromium, many visitors.
"""

from __future__ import annotations

import io
import json
import re
import threading
import unicodedata
import warnings
import zipfile

import plotly.graph_objects as go

SCALE = 3  # PNG pixels per layout pixel: a 1,200-px-wide figure becomes 3,600 px
WIDTH = 1200  # layout pixels of an exported figure (the page's own width varies with the browser)
_lock = threading.Lock()
_server = False


class ExportError(RuntimeError):
    """An export could not be made; the message is meant for the user."""


def slug(*parts: str, max_len: int = 80) -> str:
    """A file-name-safe stem from its parts: '3 · Attention', 'Why is the sky blue?' -> '3-attention_why-is-the-sky-blue'."""
    out = []
    for p in parts:
        s = unicodedata.normalize("NFKD", str(p)).encode("ascii", "ignore").decode()
        s = re.sub(r"[^A-Za-z0-9]+", "-", s).strip("-").lower()
        if s:
            out.append(s)
    return "_".join(out)[:max_len].strip("-_") or "figure"


def for_export(fig: go.Figure) -> go.Figure:
    """A copy drawn for a slide (image() also draws the numbers on it, see labelled()): white background, every axis title and tick label inside the canvas (automargin),
    the title kept, a fixed width so the file does not depend on the visitor's window."""
    f = go.Figure(fig)
    f.update_layout(template="plotly_white", paper_bgcolor="white", width=WIDTH, height=max(int(f.layout.height or 500), 360))
    f.update_xaxes(automargin=True)
    f.update_yaxes(automargin=True)
    m = f.layout.margin
    f.update_layout(margin=dict(l=max(m.l or 0, 60), r=max(m.r or 0, 40), t=max(m.t or 0, 70 if f.layout.title.text else 30), b=max(m.b or 0, 60)))
    return f


def image(fig: go.Figure, fmt: str = "png", scale: int = SCALE) -> bytes:
    """The figure as SVG or PNG bytes (PNG at `scale`x)."""
    global _server
    if fmt not in ("png", "svg"):
        raise ValueError(f"format {fmt!r}: png or svg")
    with _lock:
        try:
            import kaleido

            if not _server:
                kaleido.start_sync_server(silence_warnings=True)
                _server = True
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)  # "kopts ignored with a server": expected
                return for_export(labelled(fig)).to_image(format=fmt, scale=scale if fmt == "png" else 1)
        except Exception as e:  # noqa: BLE001 - no Chromium, a broken figure: a message, the app keeps serving
            raise ExportError(f"Could not draw the figure as {fmt.upper()}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}") from e


def figure_numbers(fig: go.Figure) -> list[dict]:
    """The numbers behind a figure: each trace's name, type and data arrays (what a slide's table would need)."""
    out = []
    for tr in fig.to_plotly_json()["data"]:
        keep = {k: v for k, v in tr.items() if k in ("name", "type", "x", "y", "z", "text", "labels", "values", "base", "customdata")}
        out.append(keep)
    return out


def page_zip(
    stem: str, figures: list[tuple[str, go.Figure]], tables: dict | None = None, html: dict[str, str] | None = None, numbers: dict | None = None
) -> bytes:
    """Everything a page drew, for slides: each figure as SVG and PNG, the numbers behind each figure as JSON,
    each table as CSV, each non-Plotly view (token chips, speculative rows) as a standalone HTML file."""
    buf = io.BytesIO()
    names: dict[str, int] = {}
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:

        def unique(name: str) -> str:
            base = slug(name)
            names[base] = names.get(base, 0) + 1
            return base if names[base] == 1 else f"{base}-{names[base]}"

        all_numbers = dict(numbers or {})
        for name, fig in figures:
            n = unique(name)
            z.writestr(f"{stem}/{n}.svg", image(fig, "svg"))
            z.writestr(f"{stem}/{n}.png", image(fig, "png"))
            all_numbers[n] = figure_numbers(fig)
        for name, df in (tables or {}).items():
            z.writestr(f"{stem}/{unique(name)}.csv", df.to_csv(index=False))
        for name, body in (html or {}).items():
            z.writestr(
                f"{stem}/{unique(name)}.html", f'<!doctype html><meta charset="utf-8"><title>{name}</title><body style="font-family:sans-serif">{body}</body>'
            )
        z.writestr(f"{stem}/numbers.json", json.dumps(all_numbers, indent=1, default=_jsonable, ensure_ascii=False))
    return buf.getvalue()


def _jsonable(x):
    try:
        import numpy as np

        if isinstance(x, np.ndarray):
            return x.tolist()
        if isinstance(x, np.generic):
            return x.item()
    except ImportError:  # pragma: no cover
        pass
    return str(x)


def labelled(fig: go.Figure, max_cells: int = 300) -> go.Figure:
    """A copy with the numbers a reader would otherwise hover for drawn on the figure (for slides and
    presentation mode): values on bars, values in small heatmaps, names next to scatter points with text."""
    f = go.Figure(fig)
    for tr in f.data:
        if tr.type == "bar" and tr.texttemplate is None and tr.text is None:
            tr.update(texttemplate="%{y:.3g}" if (tr.orientation or "v") == "v" else "%{x:.3g}", textposition="auto")
        elif tr.type == "heatmap" and tr.z is not None and tr.texttemplate is None:
            z = tr.z
            cells = sum(len(r) for r in z) if len(z) and hasattr(z[0], "__len__") else len(z)
            if cells <= max_cells:
                tr.update(texttemplate="%{z:.2f}", textfont=dict(size=10))
        elif tr.type in ("scatter", "scattergl") and tr.text is not None and "text" not in (tr.mode or ""):
            tr.update(mode=(tr.mode or "markers") + "+text", textposition="top center")
    return f
