"""How a page draws what it measured: figures ready for slides (each joins the page's ZIP export), tables, verbatim
text, metrics of repeated measurements, claims only where the repeats agree, busy notes, the "How do we know?"
boxes and the page header (presentation mode, export, previous / next). Nothing here runs the model."""

from __future__ import annotations

import streamlit as st

import appstate
from components import export
from views.guard import fail
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


class PageExports:
    """What the page drew in this run, for "Export this page": figures, tables and non-Plotly views."""

    def __init__(self, title: str):
        self.title, self.figures, self.tables, self.html = title, [], {}, {}

    def stem(self) -> str:
        return export.slug(self.title, (st.session_state.get("prompt") or "")[:40])

    def zip(self) -> bytes:
        return export.page_zip(self.stem(), self.figures, self.tables, self.html)


def _exports() -> PageExports:
    return st.session_state.get("_exports") or PageExports("page")


def presenting() -> bool:
    return bool(st.session_state.get("present"))


def figure(fig, name: str = "", where=None, key: str | None = None) -> None:
    """A Plotly figure, ready for slides: its camera button saves a 3x PNG under a meaningful name, SVG and PNG
    buttons under it (drawn on click, every label inside the canvas), and it joins the page's ZIP export. In
    presentation mode the numbers are drawn on the figure (no hover needed)."""
    reg = _exports()
    title = name or (fig.layout.title.text if fig.layout.title and fig.layout.title.text else "figure")
    if presenting():
        fig = export.labelled(fig)
    stem = export.slug(reg.title, title, (st.session_state.get("prompt") or "")[:40])
    w = where or st
    config = {"toImageButtonOptions": {"format": "png", "scale": export.SCALE, "filename": stem}, "displaylogo": False}
    w.plotly_chart(fig, width="stretch", key=key, config=config)
    reg.figures.append((title, fig))
    n = len(reg.figures)
    row = w.container(horizontal=True, gap="small")  # buttons as wide as their labels, in a half-width column too
    row.download_button(
        "SVG", _image_of(fig, "svg"), f"{stem}.svg", "image/svg+xml", key=f"svg_{n}_{key or ''}", icon=":material/download:", type="tertiary", on_click="ignore"
    )
    row.download_button(
        "PNG ×3", _image_of(fig, "png"), f"{stem}.png", "image/png", key=f"png_{n}_{key or ''}", icon=":material/download:", type="tertiary", on_click="ignore"
    )


def _image_of(fig, fmt: str):
    """Deferred: the image is drawn only when its button is clicked (a closure over the figure alone)."""
    return lambda: export.image(fig, fmt)


def table(name: str, df, where=None, **kw) -> None:
    """A table (a DataFrame or a list of row dicts) shown as usual, and saved as CSV in the page's ZIP export."""
    import pandas as pd

    df = df if isinstance(df, pd.DataFrame) else pd.DataFrame(df)
    _exports().tables[name] = df
    (where or st).dataframe(df, **kw)


def html_view(body: str, name: str, where=None) -> None:
    """A non-Plotly view (token chips, speculative call rows), shown and saved as HTML in the page's ZIP export."""
    _exports().html[name] = body
    (where or st).html(body)


def page_header(title: str, takeaway: str, prev_page, next_page) -> None:
    """The run's export registry; presentation mode's layout (no sidebar, larger type), the page's takeaway
    and previous / next stage links; the toggle itself."""
    st.session_state["_exports"] = reg = PageExports(title)
    c = st.columns([6, 2, 2])
    c[1].toggle(
        "Presentation mode",
        key="present",
        bind="query-params",
        help="For a projector or slides: no sidebar, larger type, numbers drawn on the figures. The link keeps it (?present=true).",
    )
    c[2].download_button(
        "Export this page",
        reg.zip,
        f"{reg.stem()}.zip",
        "application/zip",
        key="export_page",
        on_click="ignore",
        icon=":material/folder_zip:",
        help="Every figure of this page as SVG and 3x PNG, the numbers behind them as JSON, its tables as CSV, in one ZIP",
    )
    if presenting():
        st.html(
            "<style>section[data-testid='stSidebar'],[data-testid='stSidebarCollapsedControl'],[data-testid='stExpandSidebarButton']{display:none}"
            ".stMainBlockContainer{max-width:100%;padding-left:3rem;padding-right:3rem}"
            ".stMainBlockContainer p,.stMainBlockContainer li{font-size:1.3rem}</style>"
        )
        st.info(takeaway, icon=":material/lightbulb:")
        n = st.columns([3, 3, 2])
        if prev_page is not None:
            n[0].page_link(prev_page, label=f"← {prev_page.title}")
        if next_page is not None:
            n[1].page_link(next_page, label=f"{next_page.title} →")


PASS, FAIL, SKIP = (":green[:material/check_circle:]", ":red[:material/cancel:]", ":gray[:material/remove_circle: not run]")


def verdict(ok: bool | None) -> str:
    """A pass / fail / not-run mark drawn with Streamlit's bundled icon font (no emoji font needed)."""
    return SKIP if ok is None else (PASS if ok else FAIL)


def _check_results() -> appstate.CheckResults:
    return st.session_state.setdefault("_checks", appstate.CheckResults())


def how_do_we_know(checks_fn, key: str, tr, label="How do we know? Cross-checks on this run", ask: bool = False):
    """An expander that runs `checks_fn()` -> [Check] once per `tr` (a trace, or a run's result object) and shows
    each measured discrepancy. Results live in the session (appstate.CheckResults), never on the shared trace.
    Checks that need extra forward passes on long prompts (or, with `ask`, always) wait for a click."""
    with st.expander(label):
        store = _check_results()
        results = store.get(key, tr)
        if results is None:
            T = getattr(tr, "T", 0)
            if (ask or T > 256) and not st.button("Run the cross-checks", key=f"chk_{key}", help="They re-run the model: seconds"):
                st.caption(
                    "The cross-checks re-run the model, so they wait for a click."
                    if ask
                    else f"{T} tokens: the cross-checks re-run the model, so they wait for a click."
                )
                return
            try:
                results = checks_fn()
            except Exception as e:  # noqa: BLE001 - a failed check is shown, the page keeps serving
                fail(e, "run a check", level="error")
                return
            store.put(key, tr, results)
        show_checks(results)


def evidence(checks, label="How do we know? Cross-checks on this run") -> None:
    """The "How do we know?" box for checks already computed (cheap arithmetic on a run's own numbers, or a
    comparison the page ran anyway)."""
    with st.expander(label):
        show_checks(checks)


def show_checks(checks) -> None:
    """Each check as one line: its verdict, what was compared, the measured discrepancy."""
    for c in checks:
        st.markdown(f"{verdict(c.ok)} **{c.name}** — {c.detail}")


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


def busy_note(busy, where=None) -> None:
    """What else this server ran while a time shown was measured (a Busy, or the slot of a heavy experiment's
    result): a warning that the time is inflated, or a one-line caption that nothing else ran."""
    if isinstance(busy, str):
        busy = recall(busy + "/busy")
    if busy is None:
        return
    w = where or st
    if busy:
        w.warning(str(busy), icon=":material/groups:")
    else:
        w.caption(str(busy))
