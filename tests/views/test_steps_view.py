"""The generation page's decode steps (issue 57) in AppTest: recorded on request, a step slider over them, every
head's newest query and the cache at that step drawn, "next step" and play, and the check on screen passing."""

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

pytestmark = pytest.mark.model

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def test_the_decode_steps_recorded_stepped_and_checked():
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["prompt"] = "The capital of France is"
    at.run()
    at.switch_page("views/stages/generation.py")
    at.run()
    assert not at.exception, at.exception
    assert not [s for s in at.slider if s.key == "steps_step"], "nothing recorded before the click"
    at.slider(key="steps_new").set_value(4).run()
    at.toggle(key="steps_on").set_value(True).run()
    assert not at.exception, at.exception
    step = at.slider(key="steps_step")
    assert step.max == 3 and step.value == 0
    keys = [m for m in at.metric if m.label == "Keys in the cache"]
    assert keys and keys[0].value == "5"  # the prompt's 5 tokens at step 0
    at.button(key="steps_next").click().run()
    assert at.slider(key="steps_step").value == 1
    assert [m for m in at.metric if m.label == "Keys in the cache"][0].value == "6"
    at.slider(key="steps_step").set_value(3).run()
    assert [m for m in at.metric if m.label == "Token chosen"]
    box = next(e for e in at.expander if e.label.startswith("How do we know"))
    box.button[0].click().run()
    assert not at.exception, at.exception
    from views.proof import PASS

    text = " ".join(m.value for e in at.expander if e.label.startswith("How do we know") for m in e.markdown)
    assert "full eager forward" in text and PASS in text, text
