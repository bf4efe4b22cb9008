"""Live classes without Streamlit (appstate.classes): codes without look-alikes, one class per presenter's browser, only
the owner publishes, followers counted by their heartbeats, ending and expiry said to a follower, a bound on classes."""

import threading

import pytest

from appstate.classes import ALPHABET, CODE_LEN, SEEN_S, Classes, Ended, is_code

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
    assert cs.start("browser-a") is a, "every tab of the presenter's browser drives the same class"
    assert cs.start("browser-b").code != a.code and len(cs) == 2
    assert cs.of_owner("browser-a") is a and cs.of_owner("nobody") is None
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


def test_an_ended_or_expired_class_says_so_and_a_wrong_code_says_so():
    clock = Clock()
    cs = Classes(idle_s=60, clock=clock)
    c = cs.start("owner")
    cs.end(c.code, "a-student")  # only the owner ends it
    cs.follow(c.code, "s1")
    cs.end(c.code, "owner")
    with pytest.raises(Ended, match="presenter closed it"):
        cs.follow(c.code, "s1")
    d = cs.start("owner")
    assert d.code != c.code
    clock.t += 61
    with pytest.raises(Ended, match="expired"):
        cs.follow(d.code, "s1")
    with pytest.raises(Ended, match="no live class"):
        cs.follow("23456789", "s1")
    with pytest.raises(Ended, match="no live class"):
        cs.follow("<script>", "s1")


def test_many_classes_at_once_are_bounded_and_thread_safe():
    cs = Classes(max_classes=8)
    out = []
    threads = [threading.Thread(target=lambda i=i: out.append(cs.start(f"b{i}"))) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(out) == 40 and len(cs) == 8 and len({c.code for c in out}) == 40


def test_a_question_takes_one_answer_per_browser_rate_limited_until_it_is_revealed():
    clock = Clock()
    cs = Classes(clock=clock)
    c = cs.start("owner")
    with pytest.raises(Ended):
        cs.ask(c.code, "a-student", "The capital of France is", ["Paris"])
    q = cs.ask(c.code, "owner", "The capital of France is", ["London", "Paris"])
    assert cs.answer(c.code, "b1", "  Paris ") == "Paris"
    with pytest.raises(ValueError, match="2 seconds"):
        cs.answer(c.code, "b1", "London")
    clock.t += 2.5
    cs.answer(c.code, "b1", "London")  # a browser's new answer replaces its old one
    clock.t += 2.5
    cs.answer(c.code, "b2", "Paris")
    cs.answer(c.code, "b3", "Paris")
    assert q.tally() == {"Paris": 2, "London": 1}
    for bad, why in (("", "Type a word"), ("x" * 41, "at most 40")):
        with pytest.raises(ValueError, match=why):
            cs.answer(c.code, "b4", bad)
    cs.reveal(c.code, "owner", "Paris")
    clock.t += 5
    with pytest.raises(ValueError, match="closed"):
        cs.answer(c.code, "b5", "Rome")
    assert cs.question(c.code).answer == "Paris" and cs.ask(c.code, "owner", "Dog bites", ["man"]).number == 2


def test_the_join_link_is_the_front_page_with_the_code_and_its_qr_code_an_svg():
    from components.join import join_url, qr_svg

    slugs = ["", "attention", "attention-kernels", "why"]
    assert join_url("http://host:8501/attention-kernels?prompt=x", slugs, "abcdefgh") == "http://host:8501/?follow=abcdefgh"
    assert join_url("http://host:8501/attention", slugs, "abcdefgh") == "http://host:8501/?follow=abcdefgh"
    assert join_url("", slugs, "abcdefgh") == "http://localhost:8501/?follow=abcdefgh"
    svg = qr_svg("http://host:8501/?follow=abcdefgh")
    assert svg.startswith("<svg") and "QR code of the join link" in svg
