"""A live class, the presenter's side: publishing what this browser shows, and the header's controls (start a class;
the running class's join link, code, QR code, how many follow and how many show the current view, handing results
over, the end). The students' side is views.live; the question on the next-token page views.live_question.

The popover's follower count is also the presenter's heartbeat: while a presenter's tab is open the class is present
(appstate.classes.Classes.beat), whether or not anyone clicks; a class ends when its presenter ends it, the operator
does, or its presenter's page has been closed for the configured idle time."""

from __future__ import annotations

import time

import streamlit as st

import appstate
from appstate.classes import Ended, Full
from components.join import join_url, qr_svg
from hosting.store import StoreDown
from views import guard, live_wake
from views.live import class_log, classes, current_view
from views.session import client_address, freeze_runs, session_key


def publish(slug: str) -> None:
    """A presenter's run: the class (if this browser runs one) gets this view. While the store is away the view waits
    (`_live_unpublished`): the presenter's heartbeat publishes it when the store is back."""
    try:
        c = classes().of_owner(session_key())
        view = classes().publish(c.code, session_key(), slug, current_view(slug)) if c is not None else None
    except Ended:  # ended between the two calls (the operator, another tab)
        return
    except StoreDown as e:
        if st.session_state.get("_live_code_presented"):
            st.session_state["_live_unpublished"] = slug
            st.toast(f"Your class did not get this view yet: {e}. It gets it as soon as the store is back.", icon=":material/cloud_off:")
        return
    st.session_state.pop("_live_unpublished", None)
    if c is not None:
        st.session_state["_live_code_presented"] = c.code
        if st.session_state.get("_live_published") != (c.code, view.number):
            st.session_state["_live_published"] = (c.code, view.number)
            live_wake.poke()  # this process's followers now; every other process's watcher within its poll
            # the load bench's clock: when the view left the presenter
            class_log({"code": c.code, "view": view.number, "published": time.time(), "slug": slug, "prompt": view.state.get("prompt")})


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
    try:
        c = classes().of_owner(session_key())
    except StoreDown as e:
        st.session_state["_live_hand_msg"] = f"Not handed over: {e}"
        return
    if c is None:
        return
    try:
        vid = freeze_runs()
    except appstate.Full as e:  # this address or the server keeps as many copies as it may
        st.session_state["_live_hand_msg"] = f"No copy was made: {e}"
        return
    try:
        n = classes().hand(c.code, session_key(), vid)
    except (StoreDown, Ended) as e:
        st.session_state["_live_hand_msg"] = f"Not handed over: {e}"
        return
    live_wake.poke()
    st.session_state["_live_hand_msg"] = f"Handed over (copy {n}): each student gets your finished runs as they are now."


def _end() -> None:
    try:
        c = classes().of_owner(session_key())
        if c is not None:
            classes().end(c.code, session_key())
    except StoreDown as e:
        st.session_state["_live_hand_msg"] = f"The class was not ended: {e}"
        return
    live_wake.poke()  # they learn it has ended


@st.fragment(run_every="2s")
def _count(code: str) -> None:
    """Who follows, every 2 s; and the presenter's heartbeat (this tab is open: the class is not idle). A class that
    ended elsewhere (the operator, another tab of this browser) redraws the page, which says so."""
    try:
        if not classes().beat(code, session_key()):
            st.session_state["_live_gone"] = code
            st.rerun(scope="app")
        if st.session_state.get("_live_unpublished"):  # a view made while the store was away: the class gets it now
            publish(st.session_state["_live_unpublished"])
        n, done, slowest = classes().caught_up(code)
    except StoreDown as e:
        st.warning(f"The class's store cannot be reached: {e}. Your students keep your last view; the class goes on when it is back.")
        return
    st.metric("Following now", n, help="Students whose page followed within the last few seconds")
    if n:
        late = f" (the slowest after {slowest:.1f} s)" if slowest is not None and done else ""
        st.caption(f"{done} of {n} show your current view{late}.")


def controls(bar, short: bool = False) -> None:
    """The presenter's side, in the page header: start a class, or the running class's join link, code, QR code,
    how many follow, and the end."""
    if st.session_state.get("_live_code") and not st.session_state.get("_live_exploring"):
        return  # a follower does not present
    try:
        c = classes().of_owner(session_key())
    except StoreDown as e:
        bar.caption(f"Live classes are unavailable for now: {e}")
        return
    if c is None:
        gone = st.session_state.pop("_live_gone", None)
        if gone:
            st.toast(f"Your live class{' ' + gone if isinstance(gone, str) else ''} has ended.", icon=":material/stop_circle:")
        go = bar.button(
            "Live class" if short else "Start a live class",
            key="live_start",
            icon=":material/cast_for_education:",
            width="content",
            help="Students who open the join link see what this browser shows (page, model, prompt, settings) as you go",
        )
        if go:
            why = guard.class_start_refusal(session_key(), client_address())  # a demo server's limits apply
            if why is None:
                try:
                    classes().start(session_key())
                except (Full, StoreDown) as e:
                    why = str(e)
                else:
                    st.rerun()
            st.warning(why, icon=":material/block:")
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
