"""Live classes without Streamlit (appstate.classes): codes without look-alikes, one class per presenter's browser, only
the owner publishes (and never a private key), followers counted by their heartbeats, ending and expiry said to a
follower who was in the class and one message for every other code, the presenter's heartbeat keeping an idle class,
a full server refusing a start rather than ending a class, the operator's list and end, the presenter's control of the
projected answers."""

import threading

import pytest

from appstate.classes import ALPHABET, CODE_LEN, SEEN_S, Classes, Ended, Full, is_code, no_class

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_codes_have_no_look_alikes_and_one_browser_has_one_class():
    assert not set("01ilo") & set(ALPHABET) and len(ALPHABET) == 31
    cs = Classes()
    a = cs.start("browser-a")
    assert is_code(a.code) and len(a.code) == CODE_LEN
    assert cs.start("browser-a").code == a.code, "every tab of the presenter's browser drives the same class"
    assert cs.start("browser-b").code != a.code and len(cs) == 2
    assert cs.of_owner("browser-a").code == a.code and cs.of_owner("nobody") is None
    for bad in ("", "ABCDEFGH", "abc", "abcdefg0", "abcdefgl", None, "abcdefgh/"):
        assert not is_code(bad), bad


def test_only_the_owner_publishes_and_a_new_number_only_when_the_view_changed():
    cs = Classes()
    c = cs.start("owner")
    with pytest.raises(Ended):
        cs.publish(c.code, "a-student", "tokens", {"prompt": "hijacked"})
    v1 = cs.publish(c.code, "owner", "tokens", {"prompt": "Dog bites man."})
    assert cs.publish(c.code, "owner", "tokens", {"prompt": "Dog bites man."}).number == v1.number
    v2 = cs.publish(c.code, "owner", "attention", {"prompt": "Dog bites man."})
    assert v2.number == v1.number + 1 and v2.slug == "attention"
    seen = cs.follow(c.code, "s1")
    assert seen.state == {"prompt": "Dog bites man."} and not hasattr(seen, "owner"), "a follower never learns the presenter's browser"


def test_followers_are_counted_by_their_heartbeats():
    clock = Clock()
    cs = Classes(clock=clock)
    c = cs.start("owner")
    for s in ("s1", "s2", "s3"):
        assert cs.follow(c.code, s) is None  # before the presenter showed anything
    cs.follow(c.code, "s1")
    assert cs.followers(c.code) == 3
    clock.t += SEEN_S + 1
    cs.follow(c.code, "s2")
    assert cs.followers(c.code) == 1
    cs.leave(c.code, "s2")
    assert cs.followers(c.code) == 0


def test_the_presenter_sees_how_many_show_the_current_view_and_how_late():
    clock = Clock()
    cs = Classes(clock=clock)
    c = cs.start("owner")
    v1 = cs.publish(c.code, "owner", "tokens", {"prompt": "Dog bites man."})
    for s in ("s1", "s2", "s3"):
        cs.follow(c.code, s)
    assert cs.caught_up(c.code) == (3, 0, None)
    clock.t += 1.5
    assert cs.shown(c.code, "s1", v1.number) == 1.5
    assert cs.shown(c.code, "s1", v1.number) is None, "a page drawn twice counts once"
    clock.t += 1.0
    cs.shown(c.code, "s2", v1.number)
    assert cs.caught_up(c.code) == (3, 2, 2.5)
    v2 = cs.publish(c.code, "owner", "attention", {"prompt": "Dog bites man."})
    assert cs.shown(c.code, "s3", v1.number) is None, "an old view drawn late is not the current one"
    assert cs.caught_up(c.code) == (3, 0, None), "a new view: nobody shows it yet"
    clock.t += 0.5
    cs.shown(c.code, "s3", v2.number)
    assert cs.caught_up(c.code) == (3, 1, 0.5)
    cs.leave(c.code, "s3")
    assert cs.caught_up(c.code) == (2, 0, 0.5)
    assert cs.caught_up("23456789") == (0, 0, None)


def _ended(cs, code, who) -> Ended:
    with pytest.raises(Ended) as e:
        cs.follow(code, who)
    return e.value


def test_an_ended_class_is_told_to_its_followers_and_reads_as_no_class_to_anyone_else():
    clock = Clock()
    cs = Classes(idle_s=60, clock=clock)
    c = cs.start("owner")
    cs.end(c.code, "a-student")  # only the owner ends it
    cs.follow(c.code, "s1")
    cs.leave(c.code, "s1")  # exploring on one's own: still one of the class
    cs.end(c.code, "owner")
    e = _ended(cs, c.code, "s1")
    assert e.member and "presenter closed it" in str(e)
    d = cs.start("owner")
    assert d.code != c.code
    cs.follow(d.code, "s1")
    clock.t += 61  # no heartbeat, nothing published: the presenter's page was closed
    e = _ended(cs, d.code, "s1")
    assert e.member and "expired" in str(e)
    # a guesser cannot tell a code that existed from one that never did: the same message, and not a member
    messages = set()
    for code in (c.code, d.code, "23456789"):
        e = _ended(cs, code, "guesser")
        assert not e.member
        messages.add(str(e).replace(code, "CODE"))
    assert messages == {no_class("CODE")}, messages
    e = _ended(cs, "<script>", "s1")
    assert not e.member and "no live class" in str(e)


def test_an_open_presenter_tab_keeps_an_idle_class_and_a_closed_one_lets_it_expire():
    clock = Clock()
    cs = Classes(idle_s=60, clock=clock)
    c = cs.start("owner")
    cs.publish(c.code, "owner", "tokens", {"prompt": "Dog bites man."})
    for _ in range(10):  # ten minutes of talking, not clicking: the tab's heartbeat every 2 s (here every 30 s)
        for _ in range(2):
            clock.t += 30
            assert cs.beat(c.code, "owner")
        cs.follow(c.code, "s1")
    assert cs.of_owner("owner").code == c.code and cs.follow(c.code, "s1").state == {"prompt": "Dog bites man."}
    assert not cs.beat(c.code, "a-student"), "only the presenter's heartbeat counts"
    clock.t += 61  # the tab closed
    assert cs.of_owner("owner") is None and _ended(cs, c.code, "s1").member


def test_a_full_server_refuses_a_new_class_and_never_ends_a_running_one():
    clock = Clock()
    cs = Classes(max_classes=8, clock=clock)
    teacher = cs.start("teacher")
    cs.publish(teacher.code, "teacher", "tokens", {"prompt": "Dog bites man."})
    clock.t += 600  # the teacher talks: the longest idle, if anything went by idleness
    out, refused = [], []

    def start(i):
        try:
            out.append(cs.start(f"stranger-{i}"))
        except Full as e:
            refused.append(str(e))

    threads = [threading.Thread(target=start, args=(i,)) for i in range(70)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 7 and len(refused) == 63 and len(cs) == 8 and len({c.code for c in out}) == 7
    assert "8 live classes already" in refused[0] and "no class was started" in refused[0]
    assert cs.follow(teacher.code, "s1").slug == "tokens", "the teacher's class still runs"
    assert cs.start("teacher").code == teacher.code, "the presenter's own class, again, at the limit too"


def test_the_operator_lists_the_running_classes_and_ends_one():
    cs = Classes()
    a, b = cs.start("a"), cs.start("b")
    cs.publish(a.code, "a", "attention", {"prompt": "x"})
    cs.follow(a.code, "s1")
    rows = cs.running()
    assert [r["code"] for r in rows] == [a.code, b.code] and rows[0]["following"] == 1 and rows[0]["page"] == "attention"
    assert "a" not in {str(v) for r in rows for v in r.values()}, "never a presenter's browser id"
    cs.close(a.code)
    e = _ended(cs, a.code, "s1")
    assert e.member and "operator" in str(e)
    assert [r["code"] for r in cs.running()] == [b.code]


def test_a_published_view_never_holds_a_private_key():
    cs = Classes()
    c = cs.start("owner")
    v = cs.publish(c.code, "owner", "tokens", {"prompt": "x", "_sid": "0123456789abcdef", "_live_code": "zzzzzzzz", 3: "x"})
    assert v.state == {"prompt": "x"}


def test_a_question_takes_one_answer_per_browser_rate_limited_until_it_is_revealed():
    clock = Clock()
    cs = Classes(clock=clock)
    c = cs.start("owner")
    with pytest.raises(Ended):
        cs.ask(c.code, "a-student", "The capital of France is", ["Paris"])
    cs.ask(c.code, "owner", "The capital of France is", ["London", "Paris"])
    assert cs.answer(c.code, "b1", "  Paris ") == "Paris"
    with pytest.raises(ValueError, match="2 seconds"):
        cs.answer(c.code, "b1", "London")
    clock.t += 2.5
    cs.answer(c.code, "b1", "London")  # a browser's new answer replaces its old one
    clock.t += 2.5
    cs.answer(c.code, "b2", "Paris")
    cs.answer(c.code, "b3", "Paris")
    assert cs.question(c.code).tally() == {"Paris": 2, "London": 1}
    for bad, why in (("", "Type a word"), ("x" * 41, "at most 40")):
        with pytest.raises(ValueError, match=why):
            cs.answer(c.code, "b4", bad)
    cs.reveal(c.code, "owner", "Paris")
    clock.t += 5
    with pytest.raises(ValueError, match="closed"):
        cs.answer(c.code, "b5", "Rome")
    assert cs.question(c.code).answer == "Paris" and cs.ask(c.code, "owner", "Dog bites", ["man"]).number == 2


def test_the_presenter_hides_answers_from_the_chart_and_can_take_choices_only():
    clock = Clock()
    cs = Classes(clock=clock)
    c = cs.start("owner")
    cs.ask(c.code, "owner", "The capital of France is", ["London", "Paris"])
    for b, text in (("b1", "Paris"), ("b2", "something rude"), ("b3", "Paris")):
        cs.answer(c.code, b, text)
    with pytest.raises(Ended):
        cs.hide(c.code, "a-student", ["Paris"])
    cs.hide(c.code, "owner", ["something rude"])
    assert cs.question(c.code).tally() == {"Paris": 2} and cs.question(c.code).tally(hidden=True) == {"Paris": 2, "something rude": 1}
    cs.hide(c.code, "owner", [])
    assert cs.question(c.code).tally() == {"Paris": 2, "something rude": 1}, "shown again"
    cs.ask(c.code, "owner", "Dog bites", ["man", "the"], choices_only=True)
    clock.t += 3
    with pytest.raises(ValueError, match="offered choices only"):
        cs.answer(c.code, "b1", "something rude")
    assert cs.answer(c.code, "b2", " man ") == "man" and cs.question(c.code).tally() == {"man": 1}


def test_the_join_link_is_the_front_page_with_the_code_and_its_qr_code_an_svg():
    from components.join import join_url, qr_svg

    slugs = ["", "attention", "attention-kernels", "why"]
    assert join_url("http://host:8501/attention-kernels?prompt=x", slugs, "abcdefgh") == "http://host:8501/?follow=abcdefgh"
    assert join_url("http://host:8501/attention", slugs, "abcdefgh") == "http://host:8501/?follow=abcdefgh"
    assert join_url("", slugs, "abcdefgh") == "http://localhost:8501/?follow=abcdefgh"
    svg = qr_svg("http://host:8501/?follow=abcdefgh")
    assert svg.startswith("<svg") and "QR code of the join link" in svg
