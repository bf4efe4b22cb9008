"""A live class: the presenter's browser publishes what it shows (page, model, prompt, chat mode, the page's settings);
students who open the join link (?follow=CODE) see the same within a couple of seconds, can explore on their own and
follow again. The classes themselves live in appstate.classes (Streamlit-free); this module wires them to the page.

Following applies the presenter's widget values to the student's own session before any widget is drawn (bound
widgets then write the address bar themselves), so a student's runs stay theirs and a prompt costs the server one
trace whoever follows (the shared trace cache)."""

from __future__ import annotations

import copy
import json
import os
import secrets

import streamlit as st

import appstate
from appstate.classes import Classes, Ended, is_code
from components.join import join_url, qr_svg
from views import guard
from views.session import freeze_runs, session_key

# what a view never carries: the student's own presentation switch, a link's frozen copy or stored prompt, the code
NOT_FOLLOWED = {"follow", "present", "view", "p", "s"}
SHARED_KEYS = ("model_choice", "prompt", "chat")  # the sidebar's (bound, but absent from the address at their defaults)


@st.cache_resource(show_spinner=False)
def classes() -> Classes:
    """This server's live classes (one store per process); an idle class expires after LLM_EXPLORER_CLASS_IDLE_MIN
    minutes (default 180)."""
    return Classes(idle_s=60 * float(os.environ.get("LLM_EXPLORER_CLASS_IDLE_MIN", "180")))


def _me() -> str:
    """This tab's follower id (counted once however often it beats)."""
    return st.session_state.setdefault("_live_me", secrets.token_hex(8))


def current_view() -> dict:
    """The widget values that make this page as this browser sees it: the sidebar's, and every bound setting that is
    not at its default (those are the ones in the address)."""
    keys = [k for k in st.query_params if k not in NOT_FOLLOWED] + list(SHARED_KEYS)
    return {k: st.session_state[k] for k in dict.fromkeys(keys) if k in st.session_state}


def publish(slug: str) -> None:
    """A presenter's run: the class (if this browser runs one) gets this view."""
    c = classes().of_owner(session_key())
    if c is not None:
        classes().publish(c.code, session_key(), slug, current_view())


def follow(slug: str, page_of) -> None:
    """A student's run, before any widget: take the join link's code, then (while following) apply the presenter's
    latest view and go to the presenter's page. `page_of(slug)` gives the st.Page to switch to."""
    code = st.query_params.get("follow")
    if code is not None:
        if not is_code(code):
            del st.query_params["follow"]
            st.warning("This link's live-class code is not a code (8 letters and digits): it was ignored.")
        elif st.session_state.get("_live_code") != code:  # a join link opened: follow
            st.session_state.update(_live_code=code, _live_exploring=False, _live_applied=None)
        elif st.session_state.get("_live_exploring"):  # exploring on one's own: a stale ?follow= does not pull back
            del st.query_params["follow"]
    st.session_state.pop("_live_q_watch", None)  # set again by the page that shows the question (views.live_question)
    code = st.session_state.get("_live_code")
    if not code or st.session_state.get("_live_exploring"):
        return
    try:
        view = classes().follow(code, _me())
    except Ended as e:
        st.session_state["_live_code"] = None
        st.query_params.pop("follow", None)
        st.info(f"{e} This page is yours to explore now.", icon=":material/co_present:")
        return
    # applied when the presenter moved on, and again when a value drifted from the view (_drifted)
    if view is not None and (view.number != st.session_state.get("_live_applied") or _drifted(view.state)):
        st.session_state["_live_applied"] = view.number
        for k in [k for k in st.query_params if k not in NOT_FOLLOWED and k not in view.state]:
            st.session_state.pop(k, None)  # at the presenter's default: back to the default here too
        st.session_state.update(copy.deepcopy(view.state))  # the student's own values from here on (lists too)
        if view.slug != slug:
            # a bound setting cannot ride in the new address, and leaving the page drops it from there: the new page's
            # first run applies the view again, before its widgets are drawn
            st.session_state["_live_applied"] = None
            st.switch_page(page_of(view.slug), query_params={"follow": code})
        if st.query_params.get("follow") != code:
            st.query_params["follow"] = code  # a refresh keeps following
    handed = classes().handed(code)
    if handed is not None and st.session_state.get("_live_handed") != handed[0]:
        # the presenter's results, once: the link's frozen-view parameter, which this run's keep_runs (the sidebar,
        # after this) copies into the student's own runs and takes out of the address, as a shared link's
        st.session_state["_live_handed"] = handed[0]
        st.query_params["view"] = handed[1]
        st.toast("The presenter handed you a copy of their results: they are on your pages now.", icon=":material/content_copy:")


def _drifted(state: dict) -> bool:
    """A followed value no longer the presenter's: a rerun carrying the address the browser had before (a bound
    widget's old ?prompt=, or none: its default) set it back (bench_live_class found a student on an earlier prompt)."""
    return any(st.session_state.get(k) != v for k, v in state.items())


def shown() -> None:
    """A follower's run that drew the presenter's view to its end: the class counts it as caught up (the presenter
    sees how many are), and with LLM_EXPLORER_CLASS_LOG set the delay is appended there as a JSON line (the load
    bench's server-side figure: from publishing to this page drawn, before the browser's own rendering)."""
    code, number = st.session_state.get("_live_code"), st.session_state.get("_live_applied")
    if not code or number is None or st.session_state.get("_live_exploring"):
        return
    delay = classes().shown(code, _me(), number)
    path = os.environ.get("LLM_EXPLORER_CLASS_LOG")
    if delay is not None and path:
        with open(path, "a") as f:
            f.write(json.dumps({"code": code, "view": number, "follower": _me(), "delay_s": round(delay, 4)}) + "\n")


def _explore() -> None:
    st.session_state["_live_exploring"] = True
    st.query_params.pop("follow", None)
    classes().leave(st.session_state.get("_live_code") or "", _me())


def _follow_again() -> None:
    st.session_state.update(_live_exploring=False, _live_applied=None)


@st.fragment(run_every="1s")
def _watch(code: str) -> None:
    """A follower's heartbeat: when the presenter shows something new, the whole page runs again and applies it."""
    try:
        view = classes().follow(code, _me())
    except Ended:
        st.rerun(scope="app")  # follow() says so and stops
    if view is not None and (view.number != st.session_state.get("_live_applied") or _drifted(view.state)):
        st.rerun(scope="app")
    handed = classes().handed(code)
    if handed is not None and handed[0] != st.session_state.get("_live_handed"):
        st.rerun(scope="app")
    if "_live_q_watch" in st.session_state:  # the next-token page shows the presenter's question: asked, or revealed
        q = classes().question(code)
        if ((q.number, q.revealed) if q else None) != st.session_state["_live_q_watch"]:
            st.rerun(scope="app")


def banner() -> None:
    """What a student sees: that the view follows the presenter, with the way out; or the way back in."""
    code = st.session_state.get("_live_code")
    if not code:
        return
    box = st.container(horizontal=True, vertical_alignment="center", key="live_banner")
    if st.session_state.get("_live_exploring"):
        box.caption(f"You left the live class {code} to explore on your own.")
        box.button("Follow again", key="live_again", on_click=_follow_again, icon=":material/co_present:", width="content")
        return
    box.info(f"This view follows the presenter's screen (live class {code}).", icon=":material/co_present:")
    box.button("Explore on my own", key="live_explore", on_click=_explore, icon=":material/explore:", width="content")
    with box:
        _watch(code)


def join_link(code: str) -> str:
    """The address a student opens: this server's front page with ?follow=CODE."""
    from views.pages import ALL

    try:
        base = st.context.url or ""
    except Exception:  # noqa: BLE001 - no client context (AppTest)
        base = ""
    return join_url(base, [p.slug for p in ALL], code)


def _hand() -> None:
    """A frozen copy of this browser's finished runs (as "Share this view" makes) handed to the class."""
    c = classes().of_owner(session_key())
    if c is None:
        return
    try:
        vid = freeze_runs()
    except appstate.Full as e:  # this address or the server keeps as many copies as it may
        st.session_state["_live_hand_msg"] = f"No copy was made: {e}"
        return
    n = classes().hand(c.code, session_key(), vid)
    st.session_state["_live_hand_msg"] = f"Handed over (copy {n}): each student gets your finished runs as they are now."


def _end() -> None:
    c = classes().of_owner(session_key())
    if c is not None:
        classes().end(c.code, session_key())


@st.fragment(run_every="2s")
def _count(code: str) -> None:
    n, done, slowest = classes().caught_up(code)
    st.metric("Following now", n, help="Students whose page followed within the last few seconds")
    if n:
        late = f" (the slowest after {slowest:.1f} s)" if slowest is not None and done else ""
        st.caption(f"{done} of {n} show your current view{late}.")


def controls(bar, short: bool = False) -> None:
    """The presenter's side, in the page header: start a class, or the running class's join link, code, QR code,
    how many follow, and the end."""
    if st.session_state.get("_live_code") and not st.session_state.get("_live_exploring"):
        return  # a follower does not present
    c = classes().of_owner(session_key())
    if c is None:
        go = bar.button(
            "Live class" if short else "Start a live class",
            key="live_start",
            icon=":material/cast_for_education:",
            width="content",
            help="Students who open the join link see what this browser shows (page, model, prompt, settings) as you go",
        )
        if go and guard.allowed("starting a live class"):  # a demo server's limits apply
            classes().start(session_key())
            st.rerun()
        return
    pop = bar.popover(
        c.code if short else f"Live class {c.code}",
        icon=":material/cast_for_education:",
        width="content",
        help="The live class: its join link, who follows, the end",
    )
    link = join_link(c.code)
    pop.markdown(f"Students open this link, or scan the code (class **{c.code}**):")
    pop.code(link, language=None, wrap_lines=True)
    pop.image(qr_svg(link), width=220, caption="The join link as a QR code")  # st.html drops an inline SVG
    with pop:
        _count(c.code)
    pop.button(
        "Hand my results to the class",
        key="live_hand",
        on_click=_hand,
        icon=":material/content_copy:",
        help="Every student gets a copy of your finished runs as they are now (generations, experiments), as a shared link's copy",
    )
    if st.session_state.get("_live_hand_msg"):
        pop.caption(st.session_state["_live_hand_msg"])
    pop.button("End the class", key="live_end", on_click=_end, icon=":material/stop_circle:")
