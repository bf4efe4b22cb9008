"""One meaning of "no limit" end to end (issue 48): an operator's 0 (or a negative number) under [demo] in
.streamlit/secrets.toml, and a cap that is absent (None, as outside demo mode), both mean no limit, through the policy
loader (demo.load_policy, which writes both as None) and through every consumer in the page (views.guard's cap,
cap_note, the per-browser and per-address limits, the address's slots); a positive cap holds. Before, the loader kept
the 0 and guard.cap took min(page_max, 0): `prompt_tokens = 0` refused every prompt ("at most 0 tokens")."""

import dataclasses

import pytest

from hosting import demo

pytestmark = pytest.mark.unit

LIMITS = [f.name for f in dataclasses.fields(demo.Caps) if f.name not in ("compile", "draft_folders")]  # the numeric caps


def loaded(**caps) -> demo.Policy:
    """The demo policy an operator's secrets.toml with these [demo] caps gives."""
    return demo.load_policy({"demo": {"enabled": True, **caps}}, {})


@pytest.mark.parametrize("written", [0, "0", -1])
def test_an_operators_zero_is_no_limit_in_the_policy(written):
    p = loaded(**{name: written for name in LIMITS})
    assert p.enabled and all(getattr(p.caps, name) is None for name in LIMITS), p.caps


def test_an_absent_cap_is_no_limit_and_a_positive_cap_holds():
    assert all(getattr(demo.load_policy({}, {}).caps, name) is None for name in LIMITS)  # outside demo mode
    assert demo.Caps(prompt_tokens=None).prompt_tokens is None
    p = loaded(prompt_tokens=7, new_tokens="64")
    assert p.caps.prompt_tokens == 7 and p.caps.new_tokens == 64 and p.caps.repeats == demo.Caps().repeats  # the rest: defaults
    # however a Caps is made (a test's dataclasses.replace, a page), an operator's 0 is written None
    assert dataclasses.replace(demo.Caps(), prompt_tokens=0).prompt_tokens is None
    assert all(demo.unlimited(x) for x in (None, 0, -3)) and not demo.unlimited(1)


@pytest.fixture
def policy(monkeypatch):
    """policy(**caps): views.guard reads the demo policy with these [demo] caps (as the operator's file would give)."""
    from views import guard

    def use(**caps):
        p = loaded(**caps)
        monkeypatch.setattr(guard, "policy", lambda: p)
        return guard

    return use


# an operator's 0 or -1, and a cap the demo policy does not set (None: a [demo] section without the key has the default)
@pytest.mark.parametrize("written", [0, -1, None])
def test_the_page_reads_an_operators_zero_and_an_absent_cap_as_no_limit(policy, written):
    guard = policy(prompt_tokens=written)
    assert guard.cap("prompt_tokens") is None
    assert guard.cap("prompt_tokens", 4096) == 4096  # the page's own maximum, not min(4096, 0)
    assert guard.cap_note("prompt_tokens", "tokens") == ""  # never "at most 0"


def test_the_page_holds_a_positive_cap(policy):
    guard = policy(prompt_tokens=7)
    assert guard.cap("prompt_tokens") == 7 and guard.cap("prompt_tokens", 4096) == 7 and guard.cap("prompt_tokens", 5) == 5
    assert guard.cap_note("prompt_tokens", "tokens") == " Demo server: at most 7 tokens."


def test_the_run_limits_read_an_operators_zero_as_no_limit(policy):
    guard = policy(requests_per_minute=0, address_per_minute=0, address_at_once=0, classes_per_hour=0)
    assert all(guard.refusal("zero-browser", "zero-address", "a run") is None for _ in range(50))
    assert all(guard.class_start_refusal("zero-browser", "zero-address") is None for _ in range(10))
    slots = demo.AddressSlots()
    with slots.hold("zero-address", guard.policy().caps.address_at_once), slots.hold("zero-address", guard.policy().caps.address_at_once):
        pass
    guard = policy(requests_per_minute=2, address_per_minute=0)  # and a positive one still refuses
    assert [guard.refusal("two-browser", "zero-address", "a run") is None for _ in range(3)] == [True, True, False]
