"""Demo mode in AppTest: the allowlist instead of "Local folder…", caps shown on their controls, server paths never
shown, a per-session rate limit, errors as request ids, the operator page behind its password."""

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

import pipeline

pytestmark = pytest.mark.model

ROOT = Path(__file__).resolve().parents[2]
APP = str(ROOT / "app.py")


@pytest.fixture
def demo_env(monkeypatch):
    monkeypatch.setenv("LLM_EXPLORER_DEMO", "1")
    monkeypatch.delenv("LLM_EXPLORER_MODELS", raising=False)
    monkeypatch.setenv("LLM_EXPLORER_OPERATOR_PASSWORD", "teacher-pw")


def page(path=None, prompt="The capital of France is", **state):
    at = AppTest.from_file(APP, default_timeout=300)
    at.session_state["prompt"] = prompt
    for k, v in state.items():
        at.session_state[k] = v
    at.run()
    if path:
        at.switch_page(path)
        at.run()
    assert not at.exception, at.exception
    return at


def texts(at) -> str:
    return "\n".join(str(e.value) for kind in ("markdown", "caption", "info", "warning", "error", "success") for e in getattr(at, kind))


def test_the_model_picker_offers_only_the_allowlist(demo_env):
    at = page()
    box = at.selectbox(key="model_choice")
    assert box.options == ["SmolLM2-135M (embedded)"]
    assert not [t for t in at.text_input if t.key == "local_path"]
    assert "Demo server: at most 512 tokens" in at.sidebar.text_area(key="prompt").help


def test_a_demo_served_in_int8_offers_the_int8_model_by_its_label(demo_env, monkeypatch):
    monkeypatch.setenv("LLM_EXPLORER_PRECISION", "int8")  # `make demo PRECISION=int8`
    at = page()
    box = at.selectbox(key="model_choice")
    assert box.value == pipeline.EMBEDDED + ":int8" and box.options == ["SmolLM2-135M (embedded, int8)"]
    assert "smollm2-135m-instruct:int8" not in texts(at)
    at.switch_page("views/stages/generation.py")
    at.run()
    at.number_input(key="gen_n").set_value(4)
    next(b for b in at.button if b.key == "gen_go").click().run()
    assert not at.exception, at.exception
    next(b for b in at.button if b.key == "gen_fp32").click().run()  # the operator listed no fp32 model
    assert not at.exception, at.exception
    assert "serves the int8 model only, so it does not load the fp32 one" in texts(at)
    assert not [m for m in at.metric if m.label == "Tokens that differ from fp32"]


def test_a_typed_or_linked_path_is_never_used(demo_env):
    from views.loading import LOCAL

    at = page(model_choice=LOCAL, local_path="/etc/shadow")
    assert "shadow" not in texts(at) and "/etc" not in texts(at)
    assert at.session_state["model_choice"] == pipeline.EMBEDDED


def test_caps_are_on_the_controls(demo_env):
    at = page("views/stages/generation.py")
    n = at.number_input(key="gen_n")
    assert n.max == 128 and "Demo server: at most 128" in n.help
    at = page("views/stages/speculative.py")
    assert "a local model folder…" not in at.selectbox(key="spec_kind").options
    assert at.number_input(key="spec_n").max == 128
    at = page("views/stages/attention_kernels.py")
    assert any("Demo server: at most 1,024 prompt tokens" in c.value for c in at.caption)


def test_a_long_prompt_is_refused_with_the_cap(demo_env):
    at = page("views/stages/tokens.py", prompt="demo cap " * 350)  # a prompt no other test traced (the cache is shared)
    at.switch_page("views/stages/attention.py")
    at.run()
    assert not at.exception
    assert any("at most 512 tokens" in w.value for w in at.warning), [w.value for w in at.warning]


@pytest.fixture
def caps(monkeypatch):
    """caps(name=value, ...): the demo policy with these caps for the rest of the test."""
    import dataclasses

    from hosting import demo

    real = demo.load_policy

    from views import guard

    def set_caps(**kw):
        monkeypatch.setattr(demo, "load_policy", lambda *a, **k: dataclasses.replace(p := real(*a, **k), caps=dataclasses.replace(p.caps, **kw)))
        guard.policy.forget()  # read for at most a second (views.guard.policy): the caps from the next page run on

    yield set_caps
    guard.policy.forget()  # and the next test not under this test's caps (its policy is read anew)


def test_the_rate_limit_says_when_to_try_again(demo_env, caps):
    caps(requests_per_minute=2)  # the overview's trace of a prompt no other test traced counts as one
    at = page("views/stages/generation.py", prompt="Rate limit check: a prompt of its own.")
    at.number_input(key="gen_n").set_value(2)
    next(b for b in at.button if b.key == "gen_go").click().run()
    assert not at.exception and not [w for w in at.warning if "too many runs" in w.value]
    next(b for b in at.button if b.key == "gen_go").click().run()
    assert any("too many runs from this browser" in w.value and "2 a minute" in w.value and "again in" in w.value for w in at.warning)


def test_an_unexpected_error_shows_a_request_id_not_the_details(demo_env, monkeypatch):
    def boom(*a, **k):
        raise FileNotFoundError("/home/teacher/.secret/weights.bin")

    monkeypatch.setattr("pipeline.lab.misconceptions.force_token", boom)
    at = page("views/stages/misconceptions.py")
    next(b for b in at.button if b.key == "myth_force").click().run()
    assert not at.exception
    shown = texts(at)
    assert "request id" in shown and "/home/teacher" not in shown and "FileNotFoundError" not in shown


@pytest.fixture
def guard(monkeypatch):
    """A fresh server-wide password guard for this test (one per process otherwise), with short waits."""
    from hosting import demo
    from views import guard as views_guard

    class Quick(demo.PasswordGuard):
        def __init__(self, **_):  # a store of its own (in memory): no other test's failures in it
            super().__init__(max_failures=3, window_s=600, lockout_s=600, throttle_s=0.05)

    monkeypatch.setattr(demo, "PasswordGuard", Quick)
    views_guard.password_guard.clear()
    yield
    views_guard.password_guard.clear()


def test_the_operator_page_asks_for_the_password(demo_env, guard):
    import time

    at = page("views/stages/operator.py")
    assert [t for t in at.text_input if t.key == "op_password"]
    assert not at.metric
    at.text_input(key="op_password").set_value("wrong").run()
    assert any("Wrong password" in e.value for e in at.error) and not at.metric
    time.sleep(0.2)  # the throttle after a wrong password
    at.text_input(key="op_password").set_value("teacher-pw").run()
    assert not at.exception
    labels = [m.label for m in at.metric]
    assert "Browsers, last 5 min" in labels and "Server memory (RSS)" in labels


def test_the_operator_page_locks_after_repeated_failures_from_any_session(demo_env, guard, caplog):
    """Guesses spread over fresh sessions share one server-wide count; once locked, the right password is refused
    too and the page says so; every failure is logged with its time, never the guess."""
    import logging
    import time

    with caplog.at_level(logging.WARNING, logger="llm_explorer"):
        for guess in ("guess-1", "guess-2", "guess-3"):
            at = page("views/stages/operator.py")  # a fresh session each time, as a script would
            time.sleep(0.5)
            at.text_input(key="op_password").set_value(guess).run()
            assert any("Wrong password" in e.value for e in at.error)
    at = page("views/stages/operator.py")
    assert any("Locked" in e.value for e in at.error) and not [t for t in at.text_input if t.key == "op_password"] and not at.metric
    logged = [r.getMessage() for r in caplog.records if "wrong password" in r.getMessage()]
    assert len(logged) == 3 and not any("guess" in m for m in logged)


def test_a_full_engine_queue_says_server_busy(demo_env, monkeypatch):
    at = page("views/stages/generation.py")
    from views import loading

    eng = pipeline.engine.engine_for(loading._loader(pipeline.EMBEDDED).result)
    monkeypatch.setattr(eng.scheduler, "max_queue", 0)  # nothing more may wait
    at.number_input(key="gen_n").set_value(2)
    next(b for b in at.button if b.key == "gen_go").click().run()
    assert not at.exception
    assert any(w.value.startswith("Server busy:") and "try again" in w.value for w in at.warning), [w.value for w in at.warning]


def test_page_one_caps_what_it_tokenizes_on_a_demo_server(demo_env):
    at = page("views/stages/tokens.py", prompt="word " * 6000)  # 30,000 characters, over the 20,000 cap
    assert not at.exception
    assert any("tokenizes at most 20,000" in w.value for w in at.warning) and not at.metric


def test_traces_and_tokenizing_count_against_the_browser_limit(demo_env, caps):
    caps(requests_per_minute=2)
    at = page("views/stages/tokens.py", prompt="limit check one, a prompt no other test tokenizes")
    for i in ("two", "three"):
        at.session_state["prompt"] = f"limit check {i}, a prompt no other test tokenizes"
        at.run()
    assert any("too many runs from this browser" in w.value for w in at.warning), [w.value for w in at.warning]


def test_an_operators_zero_prompt_tokens_runs_prompts(demo_env):
    """`prompt_tokens = 0` under [demo] in the operator's secrets.toml is no limit (issue 48: every prompt was refused,
    "at most 0 tokens"): the attention page traces the prompt, and no control says "at most 0"."""
    from views import guard

    guard.policy.forget()  # the policy is read at most once a second: this test's secrets from its first run
    try:
        at = AppTest.from_file(APP, default_timeout=300)
        at.secrets["demo"] = {"enabled": True, "prompt_tokens": 0}
        at.session_state["prompt"] = "An operator's zero is no limit."
        at.run()
        at.switch_page("views/stages/attention.py")
        at.run()
        assert not at.exception, at.exception
        said = texts(at) + "\n" + "\n".join(str(getattr(e, "help", "") or "") for e in at.sidebar.text_area)
        assert "at most 0" not in said, said
        assert at.get("plotly_chart"), "the attention page drew no figure: its prompt did not run"
    finally:
        guard.policy.forget()
