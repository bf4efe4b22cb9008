"""Every page's "How do we know?" box: the cross-checks of its numbers against an independent computation, run once
per trace (or run) for the whole server, each drawn as one line with its verdict and measured discrepancy."""

from __future__ import annotations

import streamlit as st

import appstate
from views import guard

PASS, FAIL, SKIP = (":green[:material/check_circle:]", ":red[:material/cancel:]", ":gray[:material/remove_circle: not run]")


def verdict(ok: bool | None) -> str:
    """A pass / fail / not-run mark drawn with Streamlit's bundled icon font (no emoji font needed)."""
    return SKIP if ok is None else (PASS if ok else FAIL)


@st.cache_resource(show_spinner=False)
def _check_results() -> appstate.CheckResults:
    """The server's cross-check results (one store: a shared trace is checked once, whoever opens its page)."""
    return appstate.CheckResults()


def how_do_we_know(checks_fn, key: str, tr, label="How do we know? Cross-checks on this run", ask: bool = False):
    """An expander that runs `checks_fn()` -> [Check] once per (`key`, `tr`: a trace, or a run's result object) for
    the whole server and shows each measured discrepancy. The results live in one store beside the traces
    (appstate.CheckResults, weakly keyed by `tr`), never on the trace itself; `key` names everything else the checks
    depend on (a layer and head, the sampling settings). Checks that need extra forward passes on long prompts (or,
    with `ask`, always) wait for a click."""
    with st.expander(label):
        store = _check_results()
        results = store.get(key, tr)
        if results is None:
            T = getattr(tr, "T", 0)
            if (ask or T > 256) and not st.button("Run the cross-checks", key=f"chk_{key}", help="They re-run the model: seconds"):
                st.caption(
                    "The cross-checks re-run the model, so they wait for a click."
                    if ask
                    else f"{T} tokens: the cross-checks re-run the model, so they wait for a click."
                )
                return
            try:
                results = store.compute(key, tr, checks_fn)
            except Exception as e:  # noqa: BLE001 - a failed check is shown, the page keeps serving
                guard.fail(e, "run a check", level="error")
                return
        show_checks(results)


def evidence(checks, label="How do we know? Cross-checks on this run") -> None:
    """The "How do we know?" box for checks already computed (cheap arithmetic on a run's own numbers, or a
    comparison the page ran anyway)."""
    with st.expander(label):
        show_checks(checks)


def show_checks(checks) -> None:
    """Each check as one line: its verdict, what was compared, the measured discrepancy."""
    for c in checks:
        st.markdown(f"{verdict(c.ok)} **{c.name}** — {c.detail}")
