"""A live class: the presenter's browser publishes what it shows (page, model, prompt, chat mode, the page's settings);
students who open the join link (?follow=CODE) see the same within a couple of seconds, can explore on their own and
follow again. The classes themselves live in appstate.classes (Streamlit-free); this module wires the students' side
to the page (following, the banner, the heartbeat); views.live_presenter the presenter's, views.live_wake the wake-up a
new view sends the followers.

Following applies the presenter's widget values to the student's own session before any widget is drawn (bound
widgets then write the address bar themselves), so a student's runs stay theirs and a prompt costs the server one
trace whoever follows (the shared trace cache). What a view may carry is one allowlist, views.pages.view_of (the page,
model, prompt, chat mode and the page's bound settings): the presenter publishes through it and a follower applies
through it, so no identity (the browser id), limit or live-class state can travel. A code that names no running class
costs the visitor one run of the demo server's limits (a flood of guesses is refused), and reads the same whether it
never existed or has ended."""

from __future__ import annotations

import copy
import json
import os
import secrets

import streamlit as st

from appstate.classes import Classes, Ended, is_code
from hosting.store import StoreDown, shared
from views import guard, live_wake, pages
from views.session import browser_key, client_address

# the address parameters a follower keeps of its own when the presenter's page is opened for it (the student's own
# presentation switch, a link's frozen copy or stored prompt, the code); what a view carries is pages.view_of
NOT_FOLLOWED = {"follow", "present", "view", "p", "s"}


@st.cache_resource(show_spinner=False)
def classes() -> Classes:
    """This server's live classes (in the one store: every process of the app sees the same classes): a class whose presenter's page was closed (no heartbeat)
    and showed nothing for LLM_EXPLORER_CLASS_IDLE_MIN minutes (default 60) ends; at most LLM_EXPLORER_MAX_CLASSES
    (default 64) run at once, and a start beyond that is refused."""
    return Classes(
        idle_s=60 * float(os.environ.get("LLM_EXPLORER_CLASS_IDLE_MIN", "60")),
        max_classes=int(os.environ.get("LLM_EXPLORER_MAX_CLASSES", "64")),
        store=shared(),
    )


STORE_AWAY = "The live class cannot be reached right now ({e}). This page keeps the presenter's last view and follows again as soon as it is back."


def _me() -> str:
    """This tab's follower id (counted once however often it beats)."""
    return st.session_state.setdefault("_live_me", secrets.token_hex(8))


def current_view(slug: str) -> dict:
    """The widget values that make page `slug` as this browser sees it, through the one allowlist (pages.view_of):
    the sidebar's model, prompt and chat mode, and the page's bound settings that are not at their default (those
    are the ones in the address)."""
    ss = st.session_state
    shown = {k: ss[k] for k in pages.SHARED_SETTINGS if k in ss} | {k: ss[k] for k in st.query_params if k in ss}
    return pages.view_of(slug, shown)


def following() -> bool:
    """Whether this session's page follows a presenter now (not exploring on its own)."""
    return bool(st.session_state.get("_live_code")) and not st.session_state.get("_live_exploring")


def _stop_following() -> None:
    st.session_state["_live_code"] = None
    st.query_params.pop("follow", None)


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
    browser, address = browser_key(), client_address()
    if st.session_state.get("_live_in") != code:  # joining: a visitor out of runs may not try codes either
        why = guard.refusal(browser, address, "following a live class", record=False)
        if why:
            _stop_following()
            st.warning(why, icon=":material/block:")
            return
    try:
        view = classes().follow(code, _me())
    except StoreDown as e:  # still following: the heartbeat tries again
        st.warning(STORE_AWAY.format(e=e), icon=":material/cloud_off:")
        return
    except Ended as e:
        _stop_following()
        if not e.member:  # a wrong or ended code, tried: one run of the browser's and the address's limits
            guard.refusal(browser, address, "following a live class")
        st.info(f"{e} This page is yours to explore now.", icon=":material/co_present:")
        return
    st.session_state["_live_in"] = code
    state = pages.view_of(view.slug, view.state) if view is not None and view.slug in pages.BY_SLUG else None
    # applied when the presenter moved on, again when a value drifted from the view (_drifted), and when this run is on
    # another page than the presenter's: a run the browser asked for from the page it showed before (a message sent
    # before a wake-up's page reached it, the back button) once stayed there, with the view counted as shown
    if state is not None and (view.number != st.session_state.get("_live_applied") or _drifted(state) or view.slug != slug):
        st.session_state["_live_applied"] = view.number
        for k in pages.view_of(view.slug, {k: None for k in st.query_params}):
            if k not in state:
                st.session_state.pop(k, None)  # at the presenter's default: back to the default here too
        st.session_state.update(copy.deepcopy(state))  # the student's own values from here on (lists too)
        if view.slug != slug:
            # a bound setting cannot ride in the new address, and leaving the page drops it from there: the new page's
            # first run applies the view again, before its widgets are drawn
            st.session_state["_live_applied"] = None
            st.switch_page(page_of(view.slug), query_params={"follow": code})
        if st.query_params.get("follow") != code:
            st.query_params["follow"] = code  # a refresh keeps following
    handed = _handed(code)
    if handed is not None and st.session_state.get("_live_handed") != handed[0]:
        # the presenter's results, once: the link's frozen-view parameter, which this run's keep_runs (the sidebar,
        # after this) copies into the student's own runs and takes out of the address, as a shared link's
        st.session_state["_live_handed"] = handed[0]
        st.query_params["view"] = handed[1]
        st.toast("The presenter handed you a copy of their results: they are on your pages now.", icon=":material/content_copy:")


def _handed(code: str):
    try:
        return classes().handed(code)
    except StoreDown:
        return None


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
    try:
        delay = classes().shown(code, _me(), number)
    except StoreDown:
        return
    if delay is not None:
        class_log({"code": code, "view": number, "follower": _me(), "delay_s": round(delay, 4)})


def class_log(record: dict) -> None:
    """One JSON line in LLM_EXPLORER_CLASS_LOG, when set: the load bench's server-side clock (bench_live_class.py)."""
    path = os.environ.get("LLM_EXPLORER_CLASS_LOG")
    if path:
        with open(path, "a") as f:
            f.write(json.dumps(record) + "\n")


def close_chosen(key: str) -> None:
    """The operator page's button: end the class whose code widget `key` holds; its followers are told now."""
    code = st.session_state.get(key)
    if code:
        try:
            classes().close(code)
        except StoreDown as e:
            st.session_state[f"{key}_msg"] = f"Class {code} was not ended: {e}"
            return
        live_wake.poke()
        st.session_state[f"{key}_msg"] = f"Class {code} ended: its presenter and followers are told."
