"""A demo server's policy, in the page: caps on controls, the limits on starting a run (per browser, per client
address, the fair line for heavy experiments), the operator's password guard, and errors said without details.
Outside demo mode every check passes and every run just runs (timed, so other times measured meanwhile say so).
The policy itself and its data structures live in hosting/demo.py, which knows nothing of Streamlit."""

from __future__ import annotations

import os

import streamlit as st

import pipeline
from hosting import demo
from hosting.store import StoreDown, shared
from pipeline.common import fresh_for
from pipeline.forward import over_cap
from views.session import client_address, session_key


def _environment() -> tuple:
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("LLM_EXPLORER_")))


@fresh_for(1.0, key=_environment)
def policy() -> demo.Policy:
    """Demo mode's policy: LLM_EXPLORER_DEMO=1 or a [demo] section in .streamlit/secrets.toml. Read again when the
    environment's LLM_EXPLORER_ variables change (a test switches it per server) and at most once a second otherwise:
    a page asks for it at each capped control, and looking for the secrets file each time (Streamlit reads the
    configuration and checks every path when there is none) was 12% of the server's work with a class of 30 following
    (sampled by py-spy)."""
    try:
        secrets = st.secrets.to_dict() if st.secrets.load_if_toml_exists() else {}
    except Exception:  # noqa: BLE001 - a malformed secrets file must not take the app down
        secrets = {}
    return demo.load_policy(secrets)


def cap(name: str, page_max: int | None = None) -> int | None:
    """A control's maximum: the page's own, or the demo server's cap when lower (None: no limit at all). The policy
    writes "no limit" one way, None (an operator's 0 included: demo.load_policy), so a cap never reads as a maximum of 0."""
    limits = [x for x in (page_max, getattr(policy().caps, name)) if x is not None]
    return min(limits) if limits else None


def cap_note(name: str, unit: str = "") -> str:
    """ " Demo server: at most N unit." next to a capped control (empty outside demo mode, and for a cap the demo server
    does not set: None)."""
    p = policy()
    limit = getattr(p.caps, name)
    return f" Demo server: at most {limit:,}{' ' + unit if unit else ''}." if p.enabled and limit is not None else ""


@st.cache_resource(show_spinner=False)
def _errors() -> demo.ErrorLog:
    return demo.ErrorLog(store=shared())


@st.cache_resource(show_spinner=False)
def _limiter() -> demo.RateLimiter:
    return demo.RateLimiter(None, store=shared(), ns="rate:browser")


@st.cache_resource(show_spinner=False)
def _heavy_line(at_once: int | None) -> demo.FairQueue:
    return demo.FairQueue(at_once)


@st.cache_resource(show_spinner=False)
def _sessions() -> demo.Sessions:
    return demo.Sessions(store=shared())


@st.cache_resource(show_spinner=False)
def _address_limiter() -> demo.RateLimiter:
    return demo.RateLimiter(None, store=shared(), ns="rate:address")


@st.cache_resource(show_spinner=False)
def _address_slots() -> demo.AddressSlots:
    return demo.AddressSlots(store=shared())


@st.cache_resource(show_spinner=False)
def password_guard() -> demo.PasswordGuard:
    """The operator page's guard against guessing: one per server process, its locks per client address."""
    return demo.PasswordGuard(store=shared())


def fail(e: BaseException, what: str, where=None, level: str = "warning") -> None:
    """An unexpected error, said in the page: type and message on one's own machine; on a demo server only a
    request id (the details, paths and traceback are logged on the server, never shown to a visitor)."""
    w = where or st
    if isinstance(e, StoreDown):  # not a bug to hide behind an id: the operator page says the same
        getattr(w, level)(f"Could not {what}: {e}. Try again in a moment.")
        return
    if policy().enabled:
        rid = _errors().record(e, what)
        getattr(w, level)(f"Could not {what}. The server logged the details under request id **{rid}**: quote it to whoever runs this server.")
    else:
        getattr(w, level)(f"Could not {what}: {type(e).__name__}: {e}")


def refusal(browser: str, address: str, what: str, record: bool = True) -> str | None:
    """Why a demo server refuses `browser` at `address` a new run now (None: allowed, and the run is counted against
    both unless `record` is False). Streamlit-free in its inputs, so a download's deferred callable (an export) can ask
    it too. The address is asked first without recording anything: a refusal for the address does not spend the
    browser's quota."""
    p = policy()
    if not p.enabled:
        return None
    try:
        return _refusal(p, browser, address, what, record)
    except StoreDown as e:  # a limit that cannot be counted is not skipped
        return f"Refused for now: {e}. The server cannot count runs without it; try {what} again in a moment."


def _refusal(p: demo.Policy, browser: str, address: str, what: str, record: bool) -> str | None:
    wait = _limiter().wait(browser, p.caps.requests_per_minute)
    if wait:
        return (
            f"Refused: too many runs from this browser. This demo server allows {p.caps.requests_per_minute} a minute per browser "
            f"(model runs, generations, sweeps, tokenizing, exports and live-class codes all count). Try {what} again in {wait:.0f} s."
        )
    wait = _address_limiter().wait(address, p.caps.address_per_minute)
    if wait:
        return (
            f"Refused: too many runs from your network address ({p.caps.address_per_minute} a minute is the most one address may start "
            f"on this demo server). Try {what} again in {wait:.0f} s."
        )
    if not record:
        return None
    _limiter().allow(browser, p.caps.requests_per_minute)
    _address_limiter().allow(address, p.caps.address_per_minute)
    return None


@st.cache_resource(show_spinner=False)
def _class_starts() -> demo.RateLimiter:
    return demo.RateLimiter(None, window_s=3600.0, store=shared(), ns="rate:classes")


def class_start_refusal(browser: str, address: str) -> str | None:
    """Why a demo server refuses `browser` at `address` a new live class now (None: allowed, and counted): at most
    classes_per_hour per browser and per address, and a start counts as a run against the per-minute limits too."""
    p = policy()
    if not p.enabled:
        return None
    n, starts = p.caps.classes_per_hour, _class_starts()
    try:
        wait = max(starts.wait(f"browser:{browser}", n), starts.wait(f"address:{address}", n))
    except StoreDown as e:
        return f"Refused for now: {e}. Try starting the class again in a moment."
    if wait:
        return (
            f"Refused: this demo server lets one browser or network address start {n} live class{'es' if n != 1 else ''} an hour, "
            "and yours has. "
            f"Try again in {max(1, round(wait / 60))} min, or keep presenting the class you started."
        )
    why = refusal(browser, address, "starting a live class")
    if why is None:
        try:
            starts.allow(f"browser:{browser}", n)
            starts.allow(f"address:{address}", n)
        except StoreDown as e:
            return f"Refused for now: {e}. Try starting the class again in a moment."
    return why


def allowed(what: str) -> bool:
    """A demo server's limits on starting a run (always True elsewhere): per browser (requests_per_minute) and per
    client address (address_per_minute, whatever sessions or cookies it sheds); says in the page what was refused
    and when to try again."""
    why = refusal(session_key(), client_address(), what)
    if why:
        st.warning(why)
    return why is None


def address_slot():
    """A context manager holding one of this client address's places for a run queued or running (a demo server's
    address_at_once); raises demo.Busy, with a message for the page, when the address has none left."""
    p = policy()
    return _address_slots().hold(client_address(), p.caps.address_at_once if p.enabled else None)


def sweep_lengths(offered: list[int], key: str) -> list[int]:
    """A sweep's prompt lengths: those within a demo server's cap, up to the visitor's "Longest prompt" (bound to
    the link, so a shared link reruns the same sweep)."""
    top = cap("sweep_tokens")
    offered = [n for n in offered if top is None or n <= top]
    longest = st.select_slider(
        "Longest prompt", offered, value=offered[-1], key=key, bind="query-params", help="Shorter sweeps finish sooner." + cap_note("sweep_tokens")
    )
    return [n for n in offered if n <= longest]


def tokens_fit(n_tokens: int, whose: str = "The prompt") -> bool:
    """A demo server's prompt-token cap (the one check every page makes before running a prompt it does not trace;
    traces pass it to pipeline.trace as max_tokens); says so in the page when over."""
    limit = cap("prompt_tokens")
    if limit is not None and n_tokens > limit:
        st.warning(over_cap(n_tokens, limit, whose))
        return False
    return True


def prompt_fits(lm, prompt: str, chat: bool) -> bool:
    """tokens_fit for a prompt as it will be run (templated in chat mode)."""
    return cap("prompt_tokens") is None or tokens_fit(len(pipeline.tokenize(lm.tokenizer, prompt, chat=chat).input_ids))
