"""How a page draws what it measured: figures ready for slides (each joins the page's ZIP export), tables, verbatim
text, metrics of repeated measurements, claims only where the repeats agree, busy notes, the "How do we know?"
boxes. The page header and presentation mode's layout are views.header's. Nothing here runs the model."""

from __future__ import annotations

import functools

import streamlit as st

from components import export, fmt
from components.figures import clickable_cells
from views import exports, ready
from views.loading import recall


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


def presenting() -> bool:
    return bool(st.session_state.get("present"))


def prompt_source() -> str:
    """Where the visitor changes the prompt: the sidebar, or (presentation mode hides it) the page row's *Prompt*."""
    return "*Prompt* at the top" if presenting() else "the sidebar"


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
    reg = exports.current()
    title = name or (fig.layout.title.text if fig.layout.title and fig.layout.title.text else "figure")
    fig, alt = ready.figure(fig, title, presenting(), main)
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
    note = exports.context_note(settings)
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
    exports.current().images[name] = img
    (where or st).image(ready.png(img), caption=caption, width="stretch", alt=f"{name}: {caption}", output_format="PNG")  # PNG: no sniffing


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
    exports.current().tables[name] = df
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
        exports.current().tables[name] = table if isinstance(table, pd.DataFrame) else pd.DataFrame(table)
    if html is not None:
        exports.current().html[name] = html


def html_view(body: str, name: str, where=None, main: bool = False) -> None:
    """A non-Plotly view (token chips, speculative call rows), shown and saved as HTML in the page's ZIP export.
    `main`: the page's main view, which presentation mode shows first."""
    exports.current().html[name] = body
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


def overview(tr):
    """Every layer's pooled attention map (pipeline.forward.overview), with a progress bar while it is computed
    from the trace's kept queries and keys (seconds on a long prompt; once per trace, for every visitor)."""
    from pipeline.forward import OVERVIEW, overview

    if tr.acts.ready(OVERVIEW):
        return tr.acts[OVERVIEW]
    bar = st.progress(0.0, text="Computing every layer's attention map from the kept queries and keys…")
    out = overview(tr, lambda f, msg: bar.progress(f, text=f"Attention maps from the kept queries and keys: {msg}"))
    bar.empty()
    return out
