"""A live class through AppTest (two sessions in one process share the server's classes, as two browsers do): the
student follows the presenter's prompt and page, the presenter sees the student showing the current view, and the
presenter's results handed to the class arrive in the student's own runs once. (tests/browser/test_live_class.py walks
the same in Chromium with three students.)"""

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

pytestmark = pytest.mark.model

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def _session(**state) -> AppTest:
    at = AppTest.from_file(APP, default_timeout=240)
    for k, v in state.items():
        at.session_state[k] = v
    return at


def test_a_student_follows_sees_the_count_and_takes_the_presenters_results():
    from views import live

    teacher = _session(prompt="Dog bites man.")
    teacher.run()
    teacher.switch_page("views/stages/attention.py").run()
    teacher.button(key="live_start").click().run()
    assert not teacher.exception, teacher.exception
    c = live.classes().of_owner(teacher.session_state["_sid"])
    assert c is not None and c.view is not None and c.view.slug == "attention"

    student = _session()
    student.query_params["follow"] = c.code
    student.run()
    student.run()  # the presenter's page: the first run switches to it, this one draws it
    assert not student.exception, student.exception
    assert student.session_state["prompt"] == "Dog bites man." and student.query_params.get("follow") in (c.code, [c.code])
    followers, showing, slowest = live.classes().caught_up(c.code)
    assert (followers, showing) == (1, 1) and slowest is not None and slowest >= 0
    seen = {k: student.session_state[k] for k in ("_live_code", "_live_applied", "prompt", "_sid")}
    assert c.owner not in repr(seen) and c.owner != student.session_state["_sid"], "a student never learns the presenter's browser"

    # the presenter's finished runs (a result the page remembered) handed to the class: the student gets a copy once
    teacher.session_state["_runs"]["handed-test"] = ("test", "the presenter's result")
    teacher.button(key="live_hand").click().run()
    assert not teacher.exception, teacher.exception
    assert any("Handed over" in cap.value for cap in teacher.caption), [cap.value for cap in teacher.caption]
    student.run()
    assert student.session_state["_runs"].get("handed-test") == ("test", "the presenter's result")
    assert "view" not in student.query_params, "the copy is taken out of the address once taken"
    student.session_state["_runs"]["handed-test"] = ("test", "the student's own")
    student.run()
    assert student.session_state["_runs"]["handed-test"] == ("test", "the student's own"), "handed once, not on every run"
    teacher.button(key="live_end").click().run()


def test_a_following_students_run_on_another_page_returns_to_the_presenters_page():
    """A run the student's browser asks for on another page than the presenter's, the view already applied (a message
    sent from the page it showed before a wake-up's page reached it; the back button) goes to the presenter's page.
    Before (issue 48) it stayed there, its address with it, until the presenter's next change."""
    from views import live, pages

    teacher = _session(prompt="Dog bites man.")
    teacher.run()
    teacher.switch_page("views/stages/attention.py").run()
    teacher.button(key="live_start").click().run()
    c = live.classes().of_owner(teacher.session_state["_sid"])
    student = _session()
    student.query_params["follow"] = c.code
    student.run()
    student.run()
    assert not student.exception, student.exception
    assert student.session_state["_live_applied"] == c.view.number and student.title[0].value == pages.BY_SLUG["attention"].h1
    student.switch_page("views/stages/tokens.py").run()  # the browser's run on the page it showed before
    student.run()
    assert not student.exception, student.exception
    assert student.title[0].value == pages.BY_SLUG["attention"].h1, student.title[0].value
    teacher.button(key="live_end").click().run()


def test_a_view_carries_only_the_allowlist_never_the_presenters_identity_or_private_keys():
    """The presenter opened an address carrying `_sid=`, `_live_*` and an unknown key (a link a student sent), and its
    session holds private keys: the published view holds none of them, and none reaches a follower's session."""
    from views import live, pages

    teacher = _session(prompt="Dog bites man.", zz="evil", _live_secret="presenter only")
    teacher.run()
    teacher.button(key="live_start").click().run()
    sid = teacher.session_state["_sid"]
    teacher.query_params.update({"_sid": sid, "_live_code": "zzzzzzzz", "_live_exploring": "true", "zz": "evil", "_operator": "true"})
    teacher.switch_page("views/stages/attention.py").run()
    assert not teacher.exception, teacher.exception
    c = live.classes().of_owner(sid)
    assert c.view.slug == "attention" and set(c.view.state) <= {*pages.SHARED_SETTINGS, *pages.BY_SLUG["attention"].settings}, c.view.state
    assert sid not in repr(c.view.state) and "evil" not in repr(c.view.state)

    student = _session()
    student.query_params["follow"] = c.code
    student.run()
    student.run()
    assert not student.exception, student.exception
    mine = student.session_state["_sid"]
    assert mine != sid and student.session_state["prompt"] == "Dog bites man."
    for key in ("zz", "_live_secret", "_operator"):
        assert key not in student.session_state, key
    assert student.session_state["_live_code"] == c.code and not student.session_state["_live_exploring"]
    # a follower's view, applied: its prompt box shows the presenter's prompt and cannot be edited while following
    box = student.text_area(key="prompt")
    assert box.value == "Dog bites man." and box.disabled
    # and a view someone forged into the store (a private key, an unknown page) is still applied through the allowlist
    c.view.state["_sid"], c.view.state["zz"] = sid, "evil"
    c.view.number += 1
    student.run()
    assert student.session_state["_sid"] == mine and "zz" not in student.session_state
    teacher.button(key="live_end").click().run()


def test_every_widget_a_page_binds_to_the_link_is_named_in_its_view_settings():
    """pages.view_of is the one allowlist of a live class's view: a page that binds a new widget to the link and does not
    name it in its PageSpec.settings would not be followed. Read from Streamlit's binding registry as each page draws."""
    from views import live, pages

    for spec in pages.ALL:
        if spec.hidden:
            continue
        at = _session()
        at.run()
        if spec.slug:
            at.switch_page(spec.file).run()
        assert not at.exception, (spec.slug, at.exception)
        bound = set(at._session_state._state.query_params._bindings_by_param)  # Streamlit's registry (a test may read it)
        missing = bound - {*pages.SHARED_SETTINGS, *spec.settings, *live.NOT_FOLLOWED}
        assert not missing, f"page {spec.slug!r} binds {sorted(missing)} to the link; name them in its PageSpec.settings"


def test_a_question_with_choices_only_offers_no_text_box_and_a_hidden_answer_leaves_the_chart():
    from views import live

    teacher = _session(prompt="The capital of France is")
    teacher.run()
    teacher.switch_page("views/stages/next_token.py").run()
    teacher.button(key="live_start").click().run()
    c = live.classes().of_owner(teacher.session_state["_sid"])
    teacher.checkbox(key="live_choices_only").check().run()
    teacher.button(key="live_ask").click().run()
    assert not teacher.exception, teacher.exception
    q = live.classes().question(c.code)
    assert q.choices_only and "Paris" in q.options

    student = _session()
    student.query_params["follow"] = c.code
    student.run()
    student.run()
    assert not student.exception, student.exception
    assert not [t for t in student.text_input if t.key == f"live_type_{q.number}"], "no typed answers"
    student.selectbox(key=f"live_pick_{q.number}").select("Paris")
    next(b for b in student.button if "Send my guess" in str(b.label)).click()
    student.run()
    q = live.classes().question(c.code)  # a snapshot: read again after each change
    assert q.tally() == {"Paris": 1}, q.tally()

    teacher.run()  # the board: the answer, then hidden from the chart by the presenter's click
    teacher.button_group(key="live_hidden").set_value(["Paris"]).run()
    assert not teacher.exception, teacher.exception
    q = live.classes().question(c.code)
    assert q.tally() == {} and q.tally(hidden=True) == {"Paris": 1} and next(m for m in teacher.metric if m.label == "Answers").value == "1", (
        "hidden, still counted"
    )
    teacher.button_group(key="live_hidden").set_value([]).run()
    assert live.classes().question(c.code).tally() == {"Paris": 1}, "shown again"
    teacher.button(key="live_end").click().run()
