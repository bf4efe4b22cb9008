"""A live class, the follower's side in the page: the banner (following, or the way back in) and the heartbeat that
reruns the page when the presenter shows something new (woken by this process's watcher, views.live_wake, and beating
every 4 s for anything that misses; every second where waking is not available). Following itself (applying the
presenter's view before any widget) is views.live."""

from __future__ import annotations

from urllib.parse import urlsplit

import streamlit as st

from appstate.classes import Ended
from hosting.store import StoreDown
from views import live_wake, pages, st_private
from views.live import NOT_FOLLOWED, STORE_AWAY, _drifted, _handed, _me, classes


def _explore() -> None:
    st.session_state["_live_exploring"] = True
    st.query_params.pop("follow", None)
    live_wake.forget(st.session_state.get("_live_code") or "", _me())
    try:
        classes().leave(st.session_state.get("_live_code") or "", _me())
    except StoreDown:  # not counted from its next heartbeat on anyway (it beats no more)
        pass


def _follow_again() -> None:
    st.session_state.update(_live_exploring=False, _live_applied=None)


def _watch(code: str) -> None:
    """A follower's heartbeat: when the presenter shows something new, the whole page runs again and applies it.
    Woken by the presenter's run (views.live_wake), it beats every 4 s for what that misses; where waking is not
    available, every second."""
    woken = st.session_state.get("_live_woken", False)
    (_beat_slow if woken else _beat)(code)


@st.fragment(run_every="1s")
def _beat(code: str) -> None:
    _check(code)


@st.fragment(run_every="4s")
def _beat_slow(code: str) -> None:
    _check(code)


def _check(code: str) -> None:
    live_wake.watch(classes(), frozenset(NOT_FOLLOWED))  # this process's watcher (once): the class's changes wake this page
    woken = live_wake.register(code, _me())
    if woken != st.session_state.get("_live_woken", False):
        st.session_state["_live_woken"] = woken
        st.rerun(scope="app")  # the other heartbeat
    try:
        view = classes().follow(code, _me())
    except StoreDown as e:  # said in the fragment; the next beat tries again, and the page follows when it is back
        st.caption(STORE_AWAY.format(e=e))
        st.session_state["_live_away"] = True
        return
    except Ended:
        st.rerun(scope="app")  # follow() says so and stops
    if st.session_state.pop("_live_away", False):
        st.rerun(scope="app")  # back: the page again, without the message
    if view is not None and (view.number != st.session_state.get("_live_applied") or _drifted(pages.view_of(view.slug, view.state))):
        st.rerun(scope="app")
    if view is not None and _elsewhere(view):
        st.rerun(scope="app")  # the page again on the browser's page (follow() switches if that is another), and its address
    handed = _handed(code)
    if handed is not None and handed[0] != st.session_state.get("_live_handed"):
        st.rerun(scope="app")
    if "_live_q_watch" in st.session_state:  # the next-token page shows the presenter's question: asked, or revealed
        try:
            q = classes().question(code)
        except StoreDown:
            return
        if ((q.number, q.revealed) if q else None) != st.session_state["_live_q_watch"]:
            st.rerun(scope="app")


def _named(address: str) -> str:
    """The page an address names: its last path segment when that is a page's slug, else the front page ("")."""
    last = urlsplit(address).path.rstrip("/").rsplit("/", 1)[-1]
    return last if last and last in pages.BY_SLUG else ""


def _elsewhere(view) -> bool:
    """Whether this browser, as its heartbeat's message reports it, shows another page than the presenter's or has
    another page in its address bar, on two beats in a row (the first may have left before a wake-up's page arrived).
    Issue 48: a page drew the attention page under `/tokens?follow=…` for 40 s, and nothing looked at the address until
    the presenter's next change (not reproduced in ~100 changes in Chromium). A full run sends Streamlit's navigation
    message, which moves the address bar to the run's page, so the heartbeat asks for one."""
    if not st_private.fragment_run():  # a whole page's run: a wake-up's carries the browser's older address
        return False
    page, address, here = st_private.browser_page(), st_private.browser_address(), live_wake.page_hash(view.slug)
    if not ((here is not None and page is not None and page != here) or (address is not None and _named(address) != view.slug)):
        st.session_state.pop("_live_elsewhere", None)
        return False
    number, beats = st.session_state.get("_live_elsewhere") or (None, 0)
    beats = beats + 1 if number == view.number else 1
    st.session_state["_live_elsewhere"] = (view.number, beats)
    return beats in (2, 4, 6)  # two beats in a row; twice more at most for one view


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
