"""How a page draws what it measured: figures ready for slides (each joins the page's ZIP export), tables, verbatim
text, metrics of repeated measurements, claims only where the repeats agree, busy notes, the "How do we know?"
boxes. The page header and presentation mode's layout are views.header's. Nothing here runs the model."""

from __future__ import annotations

import functools

import numpy as np
import streamlit as st

import pipeline
from components import export, fmt
from components.figures import clickable_cells
from pipeline.common import memo
from views import guard
from views.loading import model_key, recall


# Widget callbacks: never a function or lambda defined in a page script. Streamlit keeps each widget's
# format_func / on_change in the session's widget metadata, and a page-level function holds the page's whole
# namespace (its trace, its results) through __globals__; a widget whose options change with the prompt gets a
# new entry per prompt, so one session used to keep every trace it ever saw (~210 MB per long prompt). These
# helpers close over plain data only.
def labeller(labels) -> callable:
    """format_func for options 0..n-1 (or the keys of a dict) that shows labels[option]."""
    return (list(labels) if not isinstance(labels, dict) else dict(labels)).__getitem__


def on_choice(select_key: str, table: dict, targets: tuple[str, ...]) -> callable:
    """on_change for a selectbox `select_key` whose choice fills other widgets: table[choice] -> one value per
    target session-state key (a single target takes the value itself)."""

    def fill():
        vals = table[st.session_state[select_key]]
        st.session_state.update({targets[0]: vals} if len(targets) == 1 else dict(zip(targets, vals)))

    return fill


def verbatim(text: str, where=None, cursor: bool = False, max_lines: int = 0):
    """Text a visitor or the model wrote, exactly as written: a code block keeps newlines and indentation and
    never reads Markdown or HTML (a generated "# heading" stays a line of code). The one way whole texts are
    drawn on every page; short pieces inside a sentence go through components.tokens.lit."""
    lines = text.count("\n") + 1
    height = 24 * max_lines + 16 if max_lines and lines > max_lines else "content"
    (where or st).code(text + (" ▌" if cursor else ""), language=None, wrap_lines=True, height=height)


class PageExports:
    """What the page drew in this run, for "Export this page": figures (with the note that goes inside their
    image), tables, images and non-Plotly views."""

    def __init__(self, title: str):
        self.title, self.figures, self.tables, self.html, self.images = title, [], {}, {}, {}
        # who asks, read now: the ZIP is made later, when the button is clicked, outside this page run
        self._who = (guard.session_key(), guard.client_address())
        self._stem = export.slug(self.title, (st.session_state.get("prompt") or "")[:40])

    def stem(self) -> str:
        return self._stem

    def zip(self) -> bytes:
        """The page's ZIP, made on the click. On a demo server it counts as a run (the browser's and the address's
        limits); a refused export is a ZIP holding only REFUSED.txt, which says why and when to try again. Its
        images are drawn one at a time through the one image exporter, so another visitor's export runs between
        this one's figures instead of waiting for all of them."""
        why = guard.refusal(*self._who, "the export")
        if why:
            return export.refused_zip(self._stem, why)
        return export.page_zip(self._stem, self.figures, self.tables, self.html, images=self.images)


# query parameters that are not a view's settings: the prompt and model are named on their own, the rest is plumbing
NOT_SETTINGS = ("prompt", "model_choice", "present", "p", "view", "s", "chat")
_LABELS: dict[str, str] = {}  # model key -> its label (a folder's label never changes)


def context_note(settings: dict | None = None) -> str:
    """What shaped this page's figures, for the line inside every exported image: the model, the prompt
    (shortened), chat mode and the view's settings (its widgets bound to the link, and the page's own)."""
    key = model_key()
    if key not in _LABELS:
        _LABELS.update({m.key: m.label for m in pipeline.available_models()})
    model = _LABELS.get(key, key)
    prompt = " ".join((st.session_state.get("prompt") or "").split())
    prompt = prompt if len(prompt) <= 60 else prompt[:57] + "…"
    parts = [model, f"prompt “{prompt}”" + (" (chat template)" if st.session_state.get("chat") else "")]
    # only the view's own settings, at their defaults too (a slide says temperature 1.0 even when the link does not):
    # a parameter that no widget of this page is bound to (a typo, or text someone put in a link: "?zz=Visit
    # evil.example") never reaches an image
    view = {setting_name(k): _shown(st.session_state[k]) for k in page_settings() if k not in NOT_SETTINGS and k in st.session_state}
    view |= {k: v for k, v in (settings or {}).items() if v is not None}
    if view:
        parts.append(", ".join(f"{k.replace('_', ' ')} {v}" for k, v in view.items()))
    return " · ".join(parts)


SETTING_NAMES = {  # a bound widget's key -> what a slide calls it (a key not here: its words, the page's prefix dropped)
    "t": "temperature",
    "k": "top-k",
    "p": "top-p",
    "minp": "min-p",
    "top_k": "top-k",
    "top_p": "top-p",
    "min_p": "min-p",
    "n": "max new tokens",
    "n_show": "candidates shown",
    "attn_scale": "colour scale",
    "attn_sink": "first token hidden",
    "attn_present_head": "head on screen",
    "bv_layers": "bertviz layers",
    "bv_view": "bertviz view",
    "roof_T": "prompt tokens",
    "roof_C": "context tokens",
    "shard_n": "devices",
    "spec_gamma": "draft tokens per call (γ)",
    "spec_kind": "draft model",
    "spec_own": "draft folder",
    "spec_prompt": "prompt",
    "myth_at": "forced at token",
    "batch_eos": "stop at end-of-sequence",
    "batch_lib": "transformers' batch too",
    "emb_refs": "reference words",
    "emb_dims": "dimensions",
    "layer_pos": "position",
}


def setting_name(key: str) -> str:
    """A bound widget's name on a slide: "gen_t" -> "temperature", "attn_head" -> "head"."""
    if key in SETTING_NAMES:
        return SETTING_NAMES[key]
    rest = key.split("_", 1)[1] if "_" in key else key
    return SETTING_NAMES.get(rest, rest.replace("_", " "))


def _shown(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v)


def page_settings() -> list[str]:
    """The keys of the widgets this page binds to the link (drawn so far in this run's page script), whatever their
    values: Streamlit's binding registry, filtered to the page's own script (the sidebar's are named apart). Where
    that registry cannot be read (another Streamlit), the settings in the address."""
    try:
        from streamlit.runtime.scriptrunner import get_script_run_ctx

        ctx = get_script_run_ctx()
        with ctx.session_state.query_params() as qp:
            return [k for k, b in qp._bindings_by_param.items() if b.script_hash == ctx.page_script_hash]
    except Exception:  # noqa: BLE001 - a private registry: fall back to what the address shows
        return list(st.query_params)


def _exports() -> PageExports:
    return st.session_state.get("_exports") or PageExports("page")


def presenting() -> bool:
    return bool(st.session_state.get("present"))


def prompt_source() -> str:
    """Where the visitor changes the prompt: the sidebar, or (presentation mode hides it) the page row's *Prompt*."""
    return "*Prompt* at the top" if presenting() else "the sidebar"


PRESENT_MAIN_HEIGHT = 430  # px: in presentation mode the main figure fits a 1280x720 projector's first screen


def figure(
    fig, name: str = "", where=None, key: str | None = None, main: bool = False, settings: dict | None = None, click_sets: tuple[str, int] | None = None
) -> None:
    """A Plotly figure, ready for slides: SVG and 3x PNG buttons under it, named after the page, figure and prompt
    (drawn on click, with the title, the model, the prompt and the settings inside the image), and it joins the
    page's ZIP export. No text is smaller than 12 px (18 px in presentation mode, where the
    numbers are drawn on the figure: no hover needed). Its text alternative is its title and the numbers behind
    it. `main`: the page's main figure, which presentation mode shows first, sized for the first screen.
    `settings`: what shaped it beyond the view's linked widgets (named in the exported image). `click_sets`: for
    a one-heatmap figure, (state key, columns): a click on a cell of one of its first `columns` columns sets that
    key to (row, column) before the next run (needs `key`)."""
    reg = _exports()
    title = name or (fig.layout.title.text if fig.layout.title and fig.layout.title.text else "figure")
    fig, alt = _ready(fig, title, presenting(), main)
    stem = export.slug(reg.title, title, (st.session_state.get("prompt") or "")[:40])
    w = where or st
    if main:
        w = w.container(key="main_figure")
    # no camera button: it would save the figure without the note that says what it shows (the buttons below do)
    config = {"modeBarButtonsToRemove": ["toImage"], "displaylogo": False}
    # theme=None: the figure's own template, as exported (Streamlit's theme would redraw its text at 12 px)
    if click_sets is None:
        w.plotly_chart(fig, width="stretch", key=key, config=config, alt=alt, theme=None)
    else:
        clicked = functools.partial(_cell_clicked, key, *click_sets)  # plain data: no page namespace kept alive
        w.plotly_chart(clickable_cells(fig), width="stretch", key=key, config=config, alt=alt, theme=None, on_select=clicked, selection_mode="points")
    note = context_note(settings)
    reg.figures.append((title, fig, note))
    n = len(reg.figures)
    row = w.container(horizontal=True, gap="small")  # buttons as wide as their labels, in a half-width column too
    for kind, label, mime, what in (("svg", "SVG", "image/svg+xml", "a vector image"), ("png", "PNG ×3", "image/png", "a 3x PNG")):
        row.download_button(
            label,
            _image_of(fig, kind, note, title),
            f"{stem}.{kind}",
            mime,
            key=f"{kind}_{n}_{key or ''}",
            icon=":material/download:",
            type="tertiary",
            on_click="ignore",
            help=f"{title} as {what} for a slide, the model, prompt and settings inside",
        )


_READY = memo.LRU()  # a shared builder's figure made ready for the page, per mode: one copy per server


def _ready(fig, title: str, present: bool, main: bool):
    """The figure as the page draws it (a copy: fonts floored, presentation mode's numbers on it and its main
    figure's height) and its text alternative. A figure from a pipeline.common.memo.shared builder is made ready once
    per server and mode (a live class's followers draw the same figures): a page never changes what it drew."""
    key = getattr(fig, "_shared_key", None)
    key = key and f"{key}|{present}|{main}|{title}"
    hit = key and _READY.get(key)
    if hit:
        return hit
    fig = export.labelled(fig) if present else type(fig)(fig)
    export.floor_fonts(fig, export.PRESENT_FONT if present else export.MIN_FONT)
    if present and main:
        fig.update_layout(height=min(int(fig.layout.height or 450), PRESENT_MAIN_HEIGHT))
    out = fig, export.alt_text(fig, title)
    if key:
        _READY.put(key, out)
    return out


def _cell_clicked(chart: str, target: str, columns: int) -> None:
    points = st.session_state[chart].selection.points
    if points and points[0].get("customdata") and int(points[0]["customdata"][1]) < columns:
        st.session_state[target] = (int(points[0]["customdata"][0]), int(points[0]["customdata"][1]))


def _image_of(fig, fmt: str, note: str, title: str):
    """Deferred: the image is drawn only when its button is clicked (a closure over the figure and its note)."""
    return lambda: export.image(fig, fmt, note=note, title=title)


def image(img, name: str, caption: str, where=None) -> None:
    """A picture the page computed (an RGB array), shown with its caption as its text alternative, and saved as
    PNG in the page's ZIP export."""
    _exports().images[name] = img
    (where or st).image(_png(img), caption=caption, width="stretch", alt=f"{name}: {caption}")


_PNGS = memo.LRU(entries=64)
MAX_IMAGE_WIDTH = 2 * 730  # px: streamlit.elements.lib.image_utils.MAXIMUM_CONTENT_WIDTH, the widest it sends


def _png(img):
    """An RGB array as PNG bytes, encoded once per server for equal pixels (Streamlit passes PNG bytes no wider than
    it sends on as they are, where it would encode, shrink and encode again an array on every run)."""
    key = memo.digest(img)
    hit = key and _PNGS.get(key[0])
    if hit:
        return hit
    import io

    from PIL import Image

    pic = Image.fromarray(np.ascontiguousarray(img))
    if pic.width > MAX_IMAGE_WIDTH:  # Streamlit would shrink it so, again on every run
        pic = pic.resize((MAX_IMAGE_WIDTH, int(pic.height * MAX_IMAGE_WIDTH / pic.width)), resample=Image.BILINEAR)
    buf = io.BytesIO()
    pic.save(buf, format="PNG")
    if key:
        _PNGS.put(key[0], buf.getvalue(), len(buf.getvalue()))
    return buf.getvalue()


def intro(text: str) -> None:
    """A page's opening explanation: read on the page; in presentation mode folded away (the teacher tells it),
    so the first screen holds the takeaway and the main figure."""
    if presenting():
        with st.expander("What this page explains"):
            st.markdown(text)
    else:
        st.markdown(text)


TABLE_ROWS = 40  # up to this many rows a table is plain HTML (read by screen readers, copied, projected as is)


def table(name: str, df, where=None, **kw) -> None:
    """A table (a DataFrame or a list of row dicts), saved as CSV in the page's ZIP export. Short tables are an HTML
    table (accessible: real cells, headers, one id each); long ones a scrolling data grid."""
    import pandas as pd

    df = df if isinstance(df, pd.DataFrame) else pd.DataFrame(df)
    _exports().tables[name] = df
    w = where or st
    if len(df) <= TABLE_ROWS and not set(kw) - {"hide_index", "width"}:
        floats = [c for c in df.columns if pd.api.types.is_float_dtype(df[c])]
        shown = df.style.format(fmt.number, subset=floats) if floats else df  # 10, not 10.0000; the export keeps every digit
        w.table(shown, alt=f"Table: {name}, {len(df)} rows", **kw)
    else:
        w.dataframe(df, **kw)


def also_export(name: str, table=None, html: str | None = None) -> None:
    """Something the page shows its own way (a table split in two columns, bertviz's iframe) that the page's ZIP
    export carries too: a table as CSV (a DataFrame or row dicts), or a whole HTML document as it is."""
    import pandas as pd

    if table is not None:
        _exports().tables[name] = table if isinstance(table, pd.DataFrame) else pd.DataFrame(table)
    if html is not None:
        _exports().html[name] = html


def html_view(body: str, name: str, where=None, main: bool = False) -> None:
    """A non-Plotly view (token chips, speculative call rows), shown and saved as HTML in the page's ZIP export.
    `main`: the page's main view, which presentation mode shows first."""
    _exports().html[name] = body
    w = where or st
    if main:  # in presentation mode a tall view scrolls inside the first screen (PRESENT_CSS: max-height)
        w = w.container(key="main_figure")
    w.html(body)


def metric_of(col, label: str, samples, scale: float = 1000.0, unit: str = "ms", digits: int = 0, help: str | None = None) -> None:
    """A metric for repeated measurements: the median as its value (short enough never to be cut), the range of
    the repeats under it."""
    f = lambda x: f"{x * scale:,.{digits}f}"  # noqa: E731
    col.metric(
        label,
        f"{f(samples.median)} {unit}".strip(),
        f"range {f(samples.lo)}–{f(samples.hi)} {unit}".strip() if len(samples.values) > 1 else None,
        delta_color="off",
        delta_arrow="off",
        help=help,
    )


def claim_or_doubt(verdict, where=None) -> None:
    """A measured trend as the page may state it (pipeline.generation.Verdict): the claim when every repeat holds
    it, else why this machine could not tell."""
    w = where or st
    if verdict.claim:
        w.caption(verdict.claim)
    else:
        w.warning(verdict.doubt, icon=":material/help:")


QUIET_BUT_NOISY = "This server ran no other request while it was measured: the noise came from outside it (other programs on this shared machine's processor)."


def busy_note(busy, where=None, noisy: bool = False) -> None:
    """What else this server ran while a time shown was measured (a Busy, or the slot of a heavy experiment's
    result): a warning that the time is inflated, or a one-line caption that nothing else ran. `noisy`: the page
    has just said its repeats were too noisy; with nothing of this server's beside them, the caption says the noise
    came from outside the server (never "nothing else ran" beside "too noisy")."""
    if isinstance(busy, str):
        busy = recall(busy + "/busy")
    if busy is None:
        return
    w = where or st
    if noisy and not busy:
        w.caption(QUIET_BUT_NOISY)
    elif busy:
        w.warning(str(busy), icon=":material/groups:")
    else:
        w.caption(str(busy))
