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
