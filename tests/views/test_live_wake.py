"""Waking followers (views.live_wake) with stand-in sessions: the presenter's new view asks each registered
follower's page to run now (the whole page, not the heartbeat fragment first), with the browser's last address and
page and no widget values, on the session's event loop; a
closed tab (its session gone) is dropped, a follower who explores is not woken, an ended class forgets them all.
(The real thing is walked in Chromium by tests/browser/test_live_class.py and measured by bench/bench_live_class.py.)"""

import gc

import pytest
from streamlit.proto.ClientState_pb2 import ClientState

from views import live_wake

pytestmark = pytest.mark.unit


class Session:
    def __init__(self, query: str):
        self._client_state = ClientState(query_string=query, page_script_hash="page")
        self._client_state.widget_states.widgets.add(id="prompt", string_value="an older prompt")
        self.asked: list[ClientState] = []
        self.scheduled = 0

    def _call_soon_on_event_loop(self, callback):
        self.scheduled += 1
        callback()

    def request_rerun(self, state):
        self.asked.append(state)


def _add(code, me, session):
    import weakref

    with live_wake._lock:
        live_wake._followers.setdefault(code, {})[me] = weakref.ref(session)


def test_a_new_view_runs_each_followers_page_now():
    a, b = Session("follow=ABCDEFGH&prompt=x"), Session("follow=ABCDEFGH")
    a._client_state.fragment_id = "beat-a"  # the browser's last message was its heartbeat
    _add("ABCDEFGH", "a", a)
    _add("ABCDEFGH", "b", b)
    assert live_wake.wake("ABCDEFGH") == 2
    (sa,), (sb,) = a.asked, b.asked
    assert (sa.fragment_id, sa.query_string, sa.page_script_hash, sa.is_auto_rerun) == ("", "follow=ABCDEFGH&prompt=x", "page", False)
    assert sb.fragment_id == "" and sb.query_string == "follow=ABCDEFGH"
    assert not sa.widget_states.widgets, "no widget values from the browser's last message (they may predate the view)"
    assert a._client_state.fragment_id == "beat-a" and len(a._client_state.widget_states.widgets) == 1, "the session's own state is left as it was"
    assert live_wake.wake("ZZZZZZZZ") == 0, "another class: nobody"

    live_wake.forget("ABCDEFGH", "a")  # explores on their own
    assert live_wake.wake("ABCDEFGH") == 1 and len(a.asked) == 1
    del b
    gc.collect()
    assert live_wake.wake("ABCDEFGH") == 0, "a closed tab's session is gone"
    assert "b" not in live_wake._followers.get("ABCDEFGH", {})


def test_an_ended_class_forgets_its_followers_and_a_broken_session_does_not_stop_the_others():
    class Broken(Session):
        def request_rerun(self, state):
            raise RuntimeError("shutting down")

    bad, good = Broken(""), Session("")
    _add("QRSTUVWX", "bad", bad)
    _add("QRSTUVWX", "good", good)
    assert live_wake.wake("QRSTUVWX") == 2 and len(good.asked) == 1
    live_wake.forget("QRSTUVWX")
    assert live_wake.wake("QRSTUVWX") == 0


def test_outside_a_streamlit_server_nothing_registers():
    assert live_wake.register("ABCDEFGH", "me") is False


def test_a_page_change_runs_each_follower_straight_on_the_presenters_page():
    """One run a follower, on the presenter's page (not the old page's run that then switches): the address keeps the
    student's own switches and the code; the view's values are applied by that run before any widget."""
    live_wake.know_pages({"attention": "hash-of-attention", "tokens": "page"})
    a = Session("follow=ABCDEFGH&prompt=old&present=1&temperature=0.5")
    _add("JKLMNPQR", "a", a)
    assert live_wake.wake("JKLMNPQR", "attention", frozenset({"present", "follow"})) == 1
    (sa,) = a.asked
    assert sa.page_script_hash == "hash-of-attention" and sa.query_string == "present=1&follow=JKLMNPQR"
    assert live_wake.wake("JKLMNPQR", "tokens") == 1, "already on that page: its address as it is"
    assert a.asked[1].page_script_hash == "page" and a.asked[1].query_string == "follow=ABCDEFGH&prompt=old&present=1&temperature=0.5"
    assert live_wake.wake("JKLMNPQR", "no-such-page") == 1 and a.asked[2].page_script_hash == "page", "an unknown page: as before"
    live_wake.forget("JKLMNPQR")
