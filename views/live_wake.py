"""A live class's followers woken the moment the presenter moves on, not at their next heartbeat, on every process.

A follower's heartbeat (views.live_beat._watch, a fragment) is timed by its browser. With 30 browser pages on one 2-core
machine the timers fired seconds late, and 30 heartbeats a second were work for the server and every browser. So each
follower's heartbeat registers its session here, and the presenter's run that publishes a new view asks Streamlit to
run every follower's page now: the rerun the heartbeat would have asked for (the browser's last address and page, the
widgets' values as the server holds them), scheduled on the server's event loop, where browser messages are handled.
The heartbeat stays, slower, for anything this misses.

The presenter may be on another process than its followers (several app processes behind a balancer): so nobody wakes
followers directly. Each process runs one watcher thread (started with its first follower) that polls the store's
change number (appstate.classes.CHANGES: one indexed read, four times a second; a presenter's own process is poked to
look at once) and, when it moved, reads the record of each class this process has followers of and wakes them when
what they show changed (the view, a hand-over, the question, the end). Polling one number was chosen over Redis pub/sub
because it works the same on both stores and costs ~20-100 us a look (bench/bench_live_class.py measures it, store_us).

This uses Streamlit's runtime internals (the session of a run, its event loop, its last ClientState, request_rerun, the
fragment's id), all through views.st_private: streamlit is pinned (requirements.txt) and
tests/app/test_streamlit_private.py checks each name; where any of it is missing (AppTest, another version) nothing is
registered and the heartbeat alone follows. Sessions are held weakly: a closed tab's is gone."""

from __future__ import annotations

import functools
import logging
import os
import threading
import weakref
from contextlib import contextmanager

from appstate.classes import CHANGES
from hosting.store import StoreDown
from views import st_private

log = logging.getLogger(__name__)
_lock = threading.Lock()
_followers: dict[str, dict[str, weakref.ref]] = {}  # class code -> follower id -> its session
MAX_PER_CLASS = 512
# LLM_EXPLORER_LIVE_WAKE=0: the public path only (each follower's st.fragment(run_every="1s") heartbeat reads the
# class and reruns its page when the view moved); bench/bench_live_class.py --public-wake measures it against waking
WAKE = os.environ.get("LLM_EXPLORER_LIVE_WAKE", "1").strip() != "0"
_pages: dict[str, str] = {}  # page slug -> Streamlit's page hash (know_pages)


def know_pages(hashes: dict[str, str]) -> None:
    """From the app's navigation (every run; the same each time): each page's hash, so that a wake-up can run a follower
    straight on the presenter's page."""
    if hashes != _pages:
        _pages.update(hashes)


def page_hash(slug: str) -> str | None:
    """The hash of page `slug` (as know_pages was told; None before, or in AppTest)."""
    return _pages.get(slug) or None


def register(code: str, me: str) -> bool:
    """From a follower's heartbeat fragment (only there: a page that follows): this session, to be woken when class
    `code` shows something new."""
    if not WAKE:
        return False
    session, fragment = st_private.this_session(), st_private.fragment_id()
    if session is None or not fragment:  # another Streamlit, bare mode, AppTest: the heartbeat alone
        return False
    with _lock:
        known = _followers.setdefault(code, {})
        known[me] = weakref.ref(session)
        if len(known) > MAX_PER_CLASS:  # closed tabs first, then the oldest
            for k in [k for k, ref in known.items() if ref() is None] or list(known)[: len(known) - MAX_PER_CLASS]:
                del known[k]
    return True


POLL_S = 0.25
_poked = threading.Event()
_watching: dict = {}  # "thread" -> the watcher; "sigs" -> class code -> what its followers show (the last look)


def _sig(c) -> tuple | None:
    """What a class's followers show, as the watcher compares it (None: the class has ended)."""
    if c is None:
        return None
    q = c.question
    return (c.view.number if c.view else None, c.handed, (q.number, q.revealed) if q else None)


def watch(classes, own: frozenset[str]) -> None:
    """Start this process's watcher (once): every change in the store's classes reaches this process's followers.
    `classes`: the app's appstate.classes.Classes; `own`: the address parameters a follower keeps (views.live)."""
    with _lock:
        if _watching.get("thread") is not None and _watching["thread"].is_alive():
            return
        _watching.setdefault("sigs", {})
        t = _watching["thread"] = threading.Thread(target=_watch_loop, args=(classes, own), name="live-class watcher", daemon=True)
        t.start()


def poke() -> None:
    """This process changed a class (a publish, a hand-over, a question, the end): its watcher looks now."""
    _poked.set()


def _watch_loop(classes, own: frozenset[str]) -> None:
    last = None
    sigs: dict = _watching["sigs"]
    while True:
        _poked.wait(POLL_S)
        _poked.clear()
        try:
            with _lock:
                codes = [code for code, known in _followers.items() if known]
            for code in codes:
                if code not in sigs:  # a class new to this process: what its followers registered on
                    sigs[code] = _sig(classes.peek(code))
            n = classes.store.number(CHANGES)
            if n == last:
                continue
            for code in codes:
                c = classes.peek(code)
                sig = _sig(c)
                if sig == sigs.get(code):
                    continue
                sigs[code] = sig
                if c is None:
                    wake(code)  # they learn it has ended
                    forget(code)
                    sigs.pop(code, None)
                else:
                    wake(code, c.view.slug if c.view else None, own)
            last = n
        except StoreDown:
            continue
        except Exception:  # noqa: BLE001 - never let the watcher die: the heartbeats would be all that is left
            log.exception("the live-class watcher failed a look")


def forget(code: str, me: str | None = None) -> None:
    """A follower who explores on their own (or, without `me`, a class that ended)."""
    with _lock:
        if me is None:
            _followers.pop(code, None)
        else:
            _followers.get(code, {}).pop(me, None)


def wake(code: str, slug: str | None = None, own: frozenset[str] = frozenset()) -> int:
    """Run every registered follower's page of class `code` now (with `slug`, the presenter's page: straight there,
    keeping of the follower's address only the parameters `own`); how many were asked."""
    with _lock:
        known = _followers.get(code, {})
        items = list(known.items())
        for k, ref in items:
            if ref() is None:
                del known[k]
    n = 0
    for _, ref in items:
        session = ref()
        if session is None:
            continue
        try:
            st_private.on_event_loop(session, functools.partial(_rerun, ref, _pages.get(slug) if slug is not None else None, code, own))
            n += 1
        except Exception:  # noqa: BLE001 - a session shutting down: its heartbeat (if any) follows
            log.debug("could not wake a follower", exc_info=True)
    return n


AT_ONCE = 2  # followers' runs at once in one process (app.py); the others wait their turn, idle
TURN_WAIT_S = 30.0  # at most this long: a run that never gave its turn back cannot stop the class
_turns = threading.BoundedSemaphore(AT_ONCE)


@contextmanager
def turn(following: bool):
    """A follower's whole page run, AT_ONCE of them at a time (anyone else's at once). Woken together, 120 followers
    were 120 script threads taking the interpreter's lock from each other every 5 ms and queueing on Streamlit's own
    locks: each student waited for all of them. In turns, the first see the view at once and the last no later."""
    if not following:
        yield
        return
    got = _turns.acquire(timeout=TURN_WAIT_S)
    try:
        yield
    finally:
        if got:
            _turns.release()


def _rerun(ref: weakref.ref, page: str | None = None, code: str = "", own: frozenset[str] = frozenset()) -> None:
    """On the event loop: the follower's whole page, with the browser's last address and page (what the heartbeat
    fragment's st.rerun(scope="app") asked for, without running the fragment first: every wake-up is something new
    to show, and that run was ~30 more script runs on one interpreter for a class of 30). A run still drawing the
    previous view is stopped for it (Streamlit's fast reruns).

    With `page` (the presenter's page's hash): that page, at an address that keeps only the parameters `own` (what a
    view never carries: views.live.NOT_FOLLOWED, the student's own switches) and the class's code; the run applies the view before any
    widget (views.live.follow), and the bound widgets write the rest of the address. Else a page change took two runs
    a follower: the old page's, to learn of the change and switch, then the new page's."""
    session = ref()
    if session is None:
        return
    try:
        state = st_private.client_state(session)
        state.ClearField("fragment_id")
        if page and state.page_script_hash != page:
            from urllib.parse import parse_qsl, urlencode

            kept = [(k, v) for k, v in parse_qsl(state.query_string, keep_blank_values=True) if k in own and k != "follow"]
            state.page_script_hash, state.query_string = page, urlencode([*kept, ("follow", code)])
        # no widget values (the session keeps the ones it has): the browser's last message may hold a prompt from
        # before the server applied the presenter's (a run the server started sends nothing back), and it would set
        # the follower's prompt back
        state.ClearField("widget_states")
        state.is_auto_rerun = False
        st_private.request_rerun(session, state)
    except Exception:  # noqa: BLE001 - the session went away in between
        log.debug("could not wake a follower", exc_info=True)
