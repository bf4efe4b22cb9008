"""The page header every page shares: its row of links and switches (presentation mode, the page's ZIP export,
the lesson handout), presentation mode's layout for a projector, and the always-on CSS that keeps labels whole and
contrast at WCAG AA. Figures, tables and checks are views.render's."""

from __future__ import annotations

import threading

import streamlit as st

from components import export
from views import guard, live, live_beat, live_presenter
from views.exports import PageExports
from views.loading import model_key
from views.pages import BY_TITLE, STAGES, PageSpec
from views.ready import PRESENT_MAIN_HEIGHT
from views.render import presenting

# Always: metric labels and values wrap instead of being cut ("Tokens the…" at 1024 px), and the sidebar's page
# icons reach the WCAG AA contrast (Streamlit draws them at 60% opacity: 3.8:1 on its grey).
BASE_CSS = (
    "[data-testid='stMetricLabel'] *,[data-testid='stMetricValue'] *{white-space:normal!important;overflow:visible!important;"
    "text-overflow:clip!important;overflow-wrap:anywhere}"
    "[data-testid='stMetricValue']{white-space:normal!important;overflow:visible!important}"
    "[data-testid='stSidebarNav'] span[color]{color:rgba(47,45,43,0.9)!important}"
    "[data-testid='stCaptionContainer'],[data-testid='stCaptionContainer'] *{color:#5c5b5a!important;opacity:1!important}"  # captions: 6.5:1, not 3.9:1
)
# Presentation mode, for a projector (1280x720 and up): no sidebar and no toolbar; the page's row of links and
# switches, its title, its takeaway and its main figure first (CSS order: the page's own order stays the
# reading order of everything else); body text larger; every metric's value larger than its label.
PRESENT_CSS = (
    "section[data-testid='stSidebar'],[data-testid='stSidebarCollapsedControl'],[data-testid='stExpandSidebarButton'],"
    "header[data-testid='stHeader']{display:none}"
    ".stMainBlockContainer{max-width:100%;padding:1rem 3rem 3rem 3rem}"
    ".stMainBlockContainer [data-testid='stMarkdownContainer'] p,.stMainBlockContainer li{font-size:1.3rem}"
    ".stMainBlockContainer h1{font-size:2.1rem;padding:0.25rem 0}"
    "[data-testid='stMetricLabel'] p{font-size:1.1rem!important}"
    "[data-testid='stMetricValue']{font-size:2.6rem!important}"
    "[data-testid='stMetricValue'] *{font-size:2.6rem!important}"
    + "".join(
        f".st-key-{k},[data-testid='stLayoutWrapper']:has(> .st-key-{k}){{order:{n}}}" for k, n in (("page_bar", -4), ("takeaway", -2), ("main_figure", -1))
    )
    + "[data-testid='stElementContainer']:has(h1){order:-3}"
    + ".st-key-main_figure .stHtml{zoom:1.4}"  # an HTML main view (token chips, speculative calls): 13 px text -> 18
    + f".st-key-main_figure:has(.stHtml){{max-height:{PRESENT_MAIN_HEIGHT}px;overflow-y:auto}}"
)


def page_header(spec: PageSpec, prev_page, next_page) -> None:
    """The run's export registry; one row of switches and downloads (presentation mode, the page's ZIP, the lesson
    handout) and, in presentation mode, the previous / next stage as links (the bound settings follow by themselves); presentation mode's layout, the page's takeaway and its heading (views/pages.py)."""
    st.session_state["_exports"] = reg = PageExports(spec.title)
    if spec.handout != "trace" and spec in STAGES:  # the experiments' and the visitor's own runs' results, kept for the handout
        st.session_state.setdefault("_drawn", {})[spec.slug] = (_drawn_key(), reg)
    bar = st.container(horizontal=True, horizontal_alignment="right", vertical_alignment="center", key="page_bar", gap="medium")
    links = bar.container(horizontal=True, vertical_alignment="center", gap="medium")  # filled once the switch is read
    bar.toggle(
        "Presentation mode",
        key="present",
        bind="query-params",
        width="content",
        help="For a projector or slides: no sidebar, larger type, the takeaway and the main figure first, numbers drawn on the figures. The link keeps it (?present=true).",
    )
    short = presenting()  # one row at 1280 px in presentation mode: the buttons' short names
    bar.download_button(
        "Export" if short else "Export this page",
        reg.zip,
        f"{reg.stem()}.zip",
        "application/zip",
        key="export_page",
        on_click="ignore",
        icon=":material/folder_zip:",
        width="content",
        help="Every figure of this page as SVG and 3x PNG (the model, prompt and settings inside each), the numbers behind them as JSON, its tables as CSV, in one ZIP",
    )
    if presenting():
        _prompt_box(bar)
    live_presenter.controls(bar, short)
    make = bar.button(
        "Handout" if short else "Lesson handout",
        key="handout_go",
        icon=":material/school:",
        width="content",
        help="One HTML file for the whole path, opening offline: every stage's main figure and numbers for this prompt, in the article's order, with the cross-checks (about 10 seconds to make)",
    )
    st.html(f"<style>{BASE_CSS}{PRESENT_CSS if presenting() else ''}</style>")
    if presenting():
        # no query_params: the bound widgets (the prompt, presentation mode, the settings) write themselves into the
        # new page's address; a link that carried them too left a second copy of each on every hop (16 after 16)
        short = lambda p: BY_TITLE[p.title].short  # noqa: E731 - "14": the row stays one line at 1280 px
        if prev_page is not None:
            links.page_link(prev_page, label=f"← {short(prev_page)}")  # no tooltip: it covered the title
        if next_page is not None:
            links.page_link(next_page, label=f"{short(next_page)} →")
    _RUN.make, _RUN.slot = make, st.container()  # filled by finish(), once the page has drawn its results
    live_beat.banner()
    if presenting() and spec.takeaway:
        st.container(key="takeaway").info(spec.takeaway, icon=":material/lightbulb:")
    st.title(spec.h1)


def _take_prompt() -> None:
    st.session_state["prompt"] = st.session_state["_present_prompt"]
    st.session_state["preset"] = "—"


def _prompt_box(bar) -> None:
    """Presentation mode hides the sidebar: its prompt and chat switch, here, in a popover of the page's row."""
    st.session_state["_present_prompt"] = st.session_state.get("prompt") or ""
    pop = bar.popover("Prompt", icon=":material/edit_note:", width="content", help="The prompt every page runs (the sidebar's, hidden while presenting)")
    led = live.following()  # a follower's prompt is the presenter's
    pop.text_area("Prompt", key="_present_prompt", height=120, on_change=_take_prompt, help="Ctrl+Enter applies it", disabled=led)
    st.session_state["_present_chat"] = bool(st.session_state.get("chat"))
    pop.toggle("Chat mode (wrap in the chat template)", key="_present_chat", on_change=_take_chat, disabled=led)


def _take_chat() -> None:
    st.session_state["chat"] = st.session_state["_present_chat"]


def _drawn_key() -> tuple:
    return (model_key(), st.session_state.get("prompt") or "", bool(st.session_state.get("chat")))


def finish() -> None:
    """After the page ran (app.py): the lesson handout, made now if its button was clicked, so the results this very
    page just drew are in it; offered in the header's place."""
    make, slot = getattr(_RUN, "make", False), getattr(_RUN, "slot", None)
    _RUN.make, _RUN.slot = False, None
    if slot is not None:
        with slot:
            _handout(make)


_RUN = threading.local()  # this run's handout click and place (a session's script runs on its own thread)


def _handout(make: bool) -> None:
    """Make the lesson handout on a click (with progress), then offer it for download for as long as the prompt,
    chat mode and model stay the same. The experiments and the visitor's own runs join it as this session last drew
    them (tables and views too: page 13's calls)."""
    from views import handout, runs

    key, kept = _drawn_key(), st.session_state.get("_handout")
    if make and guard.allowed("the lesson handout"):
        lm, tr = runs.get_trace()
        drawn = {
            slug: [(name, fig) for name, fig, *_ in reg.figures]
            + list(reg.tables.items())
            + [(name, body) for name, body in reg.html.items() if not export.is_document(body)]
            for slug, (k, reg) in st.session_state.get("_drawn", {}).items()
            if k == key
        }
        bar = st.progress(0.0, text="Making the handout…")
        try:
            body = lm.run(handout.build, lm, tr, STAGES[1:], drawn, progress=lambda f, m: bar.progress(min(1.0, f), text=m))
        except Exception as e:  # noqa: BLE001 - a failed handout is said, the page keeps serving
            bar.empty()
            guard.fail(e, "make the handout")
            return
        bar.empty()
        kept = st.session_state["_handout"] = (key, body.encode())
    if kept is not None and kept[0] == key:
        st.download_button(
            f"Download the lesson handout ({len(kept[1]) / 1e6:.1f} MB, one HTML file)",
            kept[1],
            f"{export.slug('handout', key[1][:40])}.html",
            "text/html",
            key="handout_file",
            on_click="ignore",
            icon=":material/download:",
        )
