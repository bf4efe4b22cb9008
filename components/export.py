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

from .figures import TEMPLATE, copy_figure
from .tokens import plot_text

SCALE = 3  # PNG pixels per layout pixel: a 1,200-px-wide figure becomes 3,600 px
MIN_FONT, PRESENT_FONT = 12, 18  # the smallest text a figure may draw (px): on a page, on a projector
EXPORT_FONT = 16  # ... and in an exported image: 1,200 px wide, shown full width on a projected slide
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


def _font_paths(fig: go.Figure):
    """Every font object the figure's layout and traces set explicitly (where a size smaller than the page's
    floor could hide): the layout's own, titles, axes' ticks and titles, legend, annotations, colour bars,
    trace text."""
    lay = fig.layout
    yield lay.font
    yield lay.title.font
    yield lay.legend.font
    for ax in [*fig.select_xaxes(), *fig.select_yaxes()]:
        yield ax.tickfont
        yield ax.title.font
    for a in lay.annotations:
        yield a.font
    for tr in fig.data:
        if getattr(tr, "textfont", None) is not None:
            yield tr.textfont
        if getattr(tr, "colorbar", None) is not None:
            yield tr.colorbar.tickfont
            yield tr.colorbar.title.font
        marker = getattr(tr, "marker", None)
        if marker is not None and getattr(marker, "colorbar", None) is not None:
            yield marker.colorbar.tickfont


def floor_fonts(fig: go.Figure, px: int = MIN_FONT) -> go.Figure:
    """The figure (in place) with no text smaller than `px`: the layout's font, every explicit size below it
    raised, and bar values never shrunk below it nor hidden (drawn beside the bar, or over its edge in a stack)."""
    # a bar's value is drawn at the floor even where it overflows its room (mode "hide" dropped every value of a
    # projected page's narrow subplots)
    fig.update_layout(font_size=max(fig.layout.font.size or 12, px), uniformtext=dict(minsize=px, mode="show"))
    if fig.layout.barmode not in ("stack", "relative"):  # a value inside a short bar: beside the bar instead
        for tr in fig.data:
            if tr.type == "bar" and (tr.text is not None or tr.texttemplate is not None) and tr.textposition in (None, "auto", "inside"):
                tr.update(textposition="outside", cliponaxis=False)
    for f in _font_paths(fig):
        if f is not None and f.size is not None and not isinstance(f.size, (list, tuple)) and f.size < px:
            f.size = px
    return fig


def for_export(fig: go.Figure, note: str = "", title: str = "") -> go.Figure:
    """A copy drawn for a slide (image() also draws the numbers on it, see labelled()): white background, every
    axis title and tick label inside the canvas (automargin), the title kept, no text under 16 px, a fixed width
    so the file does not depend on the visitor's window, and `note` (the model, the prompt, the settings) as a
    subtitle inside the image, so a slide says what it shows."""
    f = floor_fonts(copy_figure(fig), EXPORT_FONT)
    f.update_layout(template=TEMPLATE, paper_bgcolor="white", width=WIDTH, height=max(int(f.layout.height or 500), 360))
    f.update_xaxes(automargin=True)
    f.update_yaxes(automargin=True)
    if title and not f.layout.title.text:
        f.update_layout(title_text=plot_text(title))
    if note:
        f.update_layout(title_subtitle_text=plot_text(note), title_subtitle_font_size=EXPORT_FONT, title_yref="container", title_y=0.985, title_yanchor="top")
    m = f.layout.margin
    top = max(m.t or 0, 70 if f.layout.title.text else 30) + (30 if note else 0)
    f.update_layout(margin=dict(l=max(m.l or 0, 60), r=max(m.r or 0, 40), t=top, b=max(m.b or 0, 60)), height=f.layout.height + (30 if note else 0))
    return f


def image(fig: go.Figure, fmt: str = "png", scale: int = SCALE, note: str = "", title: str = "") -> bytes:
    """The figure as SVG or PNG bytes (PNG at `scale`x), with `note` inside it. A heatmap in an SVG is a bitmap of
    one pixel per cell that other renderers (rsvg, slide software) blur: it is enlarged, pixel by pixel, to at
    least MIN_RASTER pixels across."""
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
                data = for_export(labelled(fig), note, title).to_image(format=fmt, scale=scale if fmt == "png" else 1)
        except Exception as e:  # noqa: BLE001 - no Chromium, a broken figure: a message, the app keeps serving
            raise ExportError(f"Could not draw the figure as {fmt.upper()}: {type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}") from e
    return sharp_bitmaps(data) if fmt == "svg" else data


MIN_RASTER = 1600  # px: the narrowest a heatmap's bitmap inside an exported SVG may be
_IMAGE = re.compile(rb'href="data:image/png;base64,([A-Za-z0-9+/=]+)"')


def sharp_bitmaps(svg: bytes) -> bytes:
    """Each PNG embedded in an SVG (Plotly draws a heatmap as one, a pixel per cell) enlarged by an integer factor,
    nearest neighbour, to at least MIN_RASTER pixels wide: crisp cells in any renderer."""
    import base64

    from PIL import Image

    def bigger(m: re.Match) -> bytes:
        img = Image.open(io.BytesIO(base64.b64decode(m.group(1))))
        k = -(-MIN_RASTER // max(1, img.width))
        if k <= 1:
            return m.group(0)
        out = io.BytesIO()
        img.resize((img.width * k, img.height * k), Image.Resampling.NEAREST).save(out, "PNG", optimize=True)
        return b'href="data:image/png;base64,' + base64.b64encode(out.getvalue()) + b'"'

    return _IMAGE.sub(bigger, svg)


def _plain(v):
    """A value as JSON data: arrays (Plotly's base64 "bdata" too) as lists, NaN as null, Plotly's HTML entities
    decoded (a label "&lt;|im_end|&gt;" is the token "<|im_end|>")."""
    import html as _html

    import numpy as np

    if isinstance(v, dict) and "bdata" in v and "dtype" in v:
        import base64

        arr = np.frombuffer(base64.b64decode(v["bdata"]), dtype=v["dtype"])
        if "shape" in v:
            arr = arr.reshape([int(x) for x in str(v["shape"]).split(",")])
        return _plain(arr)
    if isinstance(v, np.ndarray):
        return _plain(v.tolist())
    if isinstance(v, np.generic):
        return _plain(v.item())
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, float):
        return None if v != v else round(v, 6)
    if isinstance(v, str):
        return _html.unescape(v)
    return v


SCHEMA = (
    "llm-explorer numbers v1: {figures: {<file stem>: {title, note, series: [{name, type, x?, y?, z?, text?, ...}]}}, "
    "tables: {<file stem>: [{column: value}]}}; numbers as numbers, text as written, null where nothing was measured"
)


def figure_numbers(fig: go.Figure) -> list[dict]:
    """The numbers behind a figure, tidy: one entry per trace (series) with its name, type and data as plain
    lists of numbers and strings. A trace whose meta names its customdata's columns ({"columns": ["token id",
    "token"]}) gives each column under its name."""
    out = []
    for tr in fig.data:
        row = {"name": _plain(tr.name) or "", "type": tr.type}
        cols = (tr.meta or {}).get("columns") if isinstance(tr.meta, dict) else None
        for k in ("x", "y", "z", "text", "labels", "values", "base", "customdata"):
            v = getattr(tr, k, None)
            if v is None:
                continue
            if k == "customdata" and cols:
                rows = _plain(v)
                for i, c in enumerate(cols):
                    row[c] = [r[i] if isinstance(r, list) else r for r in rows]
            else:
                row[k] = _plain(v)
        out.append(row)
    return out


_UNIT = re.compile(r"^\s*(-?[\d,]*\.?\d+(?:e[-+]?\d+)?)\s*([A-Za-zµ%/×]+(?:/[A-Za-z]+)?)\s*$")
_NOTED = re.compile(r"^\s*(-?\d{1,3}(?:,\d{3})*(?:\.\d+)?|-?\d+(?:\.\d+)?)\s*(?:\((.*)\))?\s*$")
_BYTES = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "KB": 1e3, "MB": 1e6, "GB": 1e9}
_TIMES = {"ns": 1e-6, "µs": 1e-3, "us": 1e-3, "ms": 1.0, "s": 1e3}


def tidy_table(df):
    """A table for a CSV: a column of strings such as "45 MiB" or "3.2 ms" becomes numbers with the unit in its
    header ("kv (MiB)"); mixed byte or time units are converted to the largest byte unit used / to ms. A column of
    numbers written for reading ("1,024", "8,192 (this model's context length)") becomes numbers, the words in
    brackets in a column of their own ("tokens note")."""
    import pandas as pd

    out = df.copy()
    for col in df.columns:
        vals = [v for v in df[col].tolist() if v is not None and not (isinstance(v, float) and v != v)]
        if not vals or not all(isinstance(v, str) for v in vals):
            continue
        noted = [_NOTED.match(v) for v in vals]
        if all(noted):
            at = list(out.columns).index(col)
            nums, notes = [], []
            for v in df[col].tolist():
                m = _NOTED.match(v) if isinstance(v, str) else None
                nums.append(float(m.group(1).replace(",", "")) if m else None)
                notes.append(m.group(2) if m else None)
            out = out.drop(columns=[col])
            whole = all(n is None or n.is_integer() for n in nums)  # counts stay counts: 1024, not 1024.0
            out.insert(at, col, pd.Series(nums, index=df.index, dtype="Int64" if whole else "float64"))
            if any(notes):
                out.insert(at + 1, f"{col} note", pd.Series([n or "" for n in notes], index=df.index))
            continue
        parsed = [_UNIT.match(v) for v in vals]
        if not all(parsed):
            continue
        units = {m.group(2) for m in parsed}
        if len(units) == 1:
            unit = next(iter(units))
            factor = {unit: 1.0}
        elif units <= set(_BYTES):
            unit = max(units, key=_BYTES.get)
            factor = {u: _BYTES[u] / _BYTES[unit] for u in units}
        elif units <= set(_TIMES):
            unit, factor = "ms", {u: _TIMES[u] for u in units}
        else:
            continue
        conv = []
        for v in df[col].tolist():
            m = _UNIT.match(v) if isinstance(v, str) else None
            conv.append(float(m.group(1).replace(",", "")) * factor[m.group(2)] if m else None)
        at = list(out.columns).index(col)
        out = out.drop(columns=[col])
        out.insert(at, f"{col} ({unit})", pd.to_numeric(pd.Series(conv, index=df.index)))
    return out


def alt_text(fig: go.Figure, title: str, max_chars: int = 900) -> str:
    """A figure's text alternative: its title and the numbers behind it (each series' first values), for a screen
    reader or anyone who cannot see the chart."""
    parts = [f"Figure: {title}."]
    for row in figure_numbers(fig):
        name = f"{row['name']} " if row["name"] else ""
        if "z" in row:
            z = row["z"]
            parts.append(f"{name}{row['type']} of {len(z)} rows × {len(z[0]) if z and isinstance(z[0], list) else 1} columns.")
            continue
        xs, ys = row.get("x") or row.get("labels") or [], row.get("y") or row.get("values") or []
        if not isinstance(xs, list) or not isinstance(ys, list):
            continue
        pairs = ", ".join(f"{x}: {y:.3g}" if isinstance(y, (int, float)) else f"{x}: {y}" for x, y in list(zip(xs, ys))[:12])
        parts.append(f"{name}({row['type']}, {len(ys)} values) {pairs}{' …' if len(ys) > 12 else ''}.")
    text = " ".join(parts)
    return text if len(text) <= max_chars else text[: max_chars - 1] + "…"


def refused_zip(stem: str, why: str) -> bytes:
    """A ZIP holding only REFUSED.txt with `why` (an export a demo server refused: the download still says so)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(f"{stem}/REFUSED.txt", why + "\n")
    return buf.getvalue()


def is_document(body: str) -> bool:
    """A whole HTML document of its own (bertviz's view), not a piece of a page."""
    return body.lstrip()[:15].lower().startswith(("<!doctype", "<html"))


def page_zip(
    stem: str, figures: list[tuple], tables: dict | None = None, html: dict[str, str] | None = None, numbers: dict | None = None, images: dict | None = None
) -> bytes:
    """Everything a page drew, for slides: each figure as SVG and PNG (its note, the model, prompt and settings,
    inside), each picture as PNG, each table as CSV (numbers in numeric columns, units in the headers), each
    non-Plotly view (token chips, speculative rows) as a standalone HTML file, and numbers.json: the numbers behind
    every figure and table as tidy named data, a schema line first. `figures`: (title, figure[, note])."""
    buf = io.BytesIO()
    names: dict[str, int] = {}
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:

        def unique(name: str) -> str:
            base = slug(name)
            names[base] = names.get(base, 0) + 1
            return base if names[base] == 1 else f"{base}-{names[base]}"

        data = {"schema": SCHEMA, "figures": {}, "tables": {}, **(numbers or {})}
        for entry in figures:
            title, fig, note = (*entry, "")[:3]
            n = unique(title)
            z.writestr(f"{stem}/{n}.svg", image(fig, "svg", note=note, title=title))
            z.writestr(f"{stem}/{n}.png", image(fig, "png", note=note, title=title))
            own = fig.layout.title.text if fig.layout.title and fig.layout.title.text else ""  # the title a reader saw
            data["figures"][n] = {"title": _plain(own) or title, "note": note, "series": figure_numbers(fig)}
        for name, img in (images or {}).items():
            from PIL import Image

            out = io.BytesIO()
            Image.fromarray(img).save(out, "PNG")
            z.writestr(f"{stem}/{unique(name)}.png", out.getvalue())
        for name, df in (tables or {}).items():
            n = unique(name)
            tidy = tidy_table(df)
            z.writestr(f"{stem}/{n}.csv", tidy.to_csv(index=False))
            data["tables"][n] = _plain(tidy.astype(object).where(tidy.notna(), None).to_dict(orient="records"))
        for name, body in (html or {}).items():
            z.writestr(
                f"{stem}/{unique(name)}.html",
                body  # a document of its own (bertviz's): as it is
                if is_document(body)
                else f'<!doctype html><html lang="en"><meta charset="utf-8"><title>{plot_text(name)}</title><body style="font-family:sans-serif">{body}</body></html>',
            )
        z.writestr(f"{stem}/numbers.json", json.dumps(data, indent=1, default=_jsonable, ensure_ascii=False))
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


def labelled(fig: go.Figure, max_cells: int = 300, max_bars: int = 40) -> go.Figure:
    """A copy with the numbers a reader would otherwise hover for drawn on the figure (for slides and
    presentation mode): values on bars, values in small heatmaps, names next to scatter points with text. Over
    `max_bars` bars in all (page 4's 31 layers x 2: 62 values piled on each other at 1280 px), each series' largest
    bar keeps its value, the others none."""
    f = copy_figure(fig)

    def values(tr):
        return tr.y if (tr.orientation or "v") == "v" else tr.x

    bars = [tr for tr in f.data if tr.type == "bar" and tr.texttemplate is None and tr.text is None and values(tr) is not None]
    many = sum(len(values(tr)) for tr in bars) > max_bars
    plain = {id(tr) for tr in bars}
    for tr in f.data:
        if id(tr) in plain and many:
            vals = list(values(tr))
            top = max(range(len(vals)), key=lambda i: -1 if vals[i] is None else abs(vals[i]), default=None)
            tr.update(text=[f"{v:.3g}" if i == top else "" for i, v in enumerate(vals)], texttemplate="%{text}", textposition="outside")
        elif id(tr) in plain:
            tr.update(texttemplate="%{y:.3g}" if (tr.orientation or "v") == "v" else "%{x:.3g}", textposition="auto")
        elif tr.type == "heatmap" and tr.z is not None and tr.texttemplate is None:
            z = tr.z
            cells = sum(len(r) for r in z) if len(z) and hasattr(z[0], "__len__") else len(z)
            if cells <= max_cells:
                tr.update(texttemplate="%{z:.2f}", textfont=dict(size=10))
        elif tr.type in ("scatter", "scattergl") and tr.text is not None and "text" not in (tr.mode or ""):
            tr.update(mode=(tr.mode or "markers") + "+text", textposition="top center")
    return f
