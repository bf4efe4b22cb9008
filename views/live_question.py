""" "What comes next?" in a live class (the next-token page): the presenter asks, students guess (a word, typed or
picked), the presenter's screen fills the class's guesses beside the model's distribution as they come, and the
presenter reveals the model's answer to everyone. The question lives in appstate.classes; answers are kept per browser
on the server and never shown one by one. The presenter decides what the projected chart shows: a question can take
the offered choices only (no typed words), and any answer can be hidden from the chart (and shown again)."""

from __future__ import annotations

import contextlib

import numpy as np
import plotly.graph_objects as go
import streamlit as st

from appstate.classes import Ended
from components.figures import BLUE, ORANGE, _layout
from components.tokens import lit, plot_text, visible
from pipeline.forward.tokens import text_of
from views import live, live_wake, render
from views.session import session_key

N_OPTIONS = 6


def _candidates(lm, tr) -> tuple[list[str], np.ndarray]:
    """The model's most likely next tokens (as a reader sees them) and its probabilities for them."""
    p = np.exp(tr.next_logits - tr.next_logits.max())
    p /= p.sum()
    top = np.argsort(-p)[:N_OPTIONS]
    return [text_of(lm.tokenizer, [int(i)]).strip() or visible(text_of(lm.tokenizer, [int(i)])) for i in top], p[top]


def guesses_figure(tally: dict[str, int], model: dict[str, float], title: str) -> go.Figure:
    """The class's guesses (share of answers) beside the model's probabilities, one pair of bars per word."""
    n = sum(tally.values()) or 1
    words = list(dict.fromkeys([*model, *tally]))[:12]
    fig = go.Figure()
    for name, vals, color in (("the class", [tally.get(w, 0) / n for w in words], ORANGE), ("the model", [model.get(w, 0.0) for w in words], BLUE)):
        fig.add_trace(
            go.Bar(
                x=[plot_text(w) for w in words],
                y=vals,
                name=name,
                marker_color=color,
                text=[f"{v:.2f}" for v in vals],
                textposition="outside",
                cliponaxis=False,
            )
        )
    fig.update_layout(barmode="group")
    fig.update_yaxes(title="share of guesses / probability", range=[0, 1.15])
    return _layout(fig, title, height=380)


def _ask(code: str, prompt: str, options: list[str]) -> None:
    shuffled = sorted(options, key=str.lower)  # alphabetical: the list gives nothing away
    with _gone():
        live.classes().ask(code, session_key(), prompt, shuffled, choices_only=bool(st.session_state.get("live_choices_only")))
        live_wake.poke()  # the students see the question now


def _hide(code: str) -> None:
    with _gone():
        live.classes().hide(code, session_key(), st.session_state.get("live_hidden") or [])


def _reveal(code: str, answer: str) -> None:
    with _gone():
        live.classes().reveal(code, session_key(), answer)
        live_wake.poke()


@contextlib.contextmanager
def _gone():
    """A presenter's click on a class that ended meanwhile (the operator, another tab): the page redraws without it."""
    try:
        yield
    except Ended:
        st.session_state["_live_gone"] = True


@st.fragment(run_every="1s")
def _board(code: str, model: dict[str, float]) -> None:
    q = live.classes().question(code)
    if q is None:
        return
    tally = q.tally()
    everything = q.tally(hidden=True)
    st.metric("Answers", sum(everything.values()), help="Every answer, the hidden ones too")
    render.figure(guesses_figure(tally, model, "What the class guessed, and the model's probabilities"), "class guesses")
    _hider(code, q, everything)


def _hider(code: str, q, everything: dict[str, int]) -> None:
    """The presenter's choice of answers kept off the chart (the server's record, so every tab of theirs agrees)."""
    st.session_state["live_hidden"] = sorted(q.hidden)
    st.pills(
        "Hide answers from the chart (click one; click again to show it)",
        sorted(set(everything) | q.hidden, key=str.lower),
        selection_mode="multi",
        key="live_hidden",
        on_change=_hide,
        args=(code,),
        help="A hidden answer still counts in “Answers” but is not drawn on the projected chart.",
    )


def presenter(lm, tr) -> None:
    """On the next-token page of a browser that runs a live class: ask, watch the guesses, reveal."""
    c = live.classes().of_owner(session_key())
    if c is None:
        return
    options, probs = _candidates(lm, tr)
    model = dict(zip(options, map(float, probs)))
    st.subheader("Ask the class: what comes next?")
    q = live.classes().question(c.code)
    if q is None or q.revealed or q.prompt != tr.prompt:
        if q is not None and q.revealed and q.prompt == tr.prompt:
            tally = q.tally()
            render.figure(guesses_figure(tally, model, "What the class guessed, and the model's probabilities"), "class guesses")
            st.caption(f"Revealed: the model's answer is {lit(repr(q.answer))}. {sum(q.tally(hidden=True).values())} answers.")
            _hider(c.code, q, q.tally(hidden=True))
        st.checkbox(
            "Choices only (no typed answers)",
            key="live_choices_only",
            help="Students pick one of the model's top candidates (listed alphabetically); nothing they type can reach the projected chart.",
        )
        st.button("Ask the class what comes next", key="live_ask", on_click=_ask, args=(c.code, tr.prompt, options), icon=":material/quiz:")
        return
    _board(c.code, model)
    st.button("Reveal the model's answer", key="live_reveal", on_click=_reveal, args=(c.code, options[0]), icon=":material/visibility:")


def follower(lm, tr) -> None:
    """On the next-token page of a student who follows: the presenter's question, a guess, then the model's answer."""
    code = st.session_state.get("_live_code")
    q = live.classes().question(code) if code and not st.session_state.get("_live_exploring") else None
    st.session_state["_live_q_watch"] = (q.number, q.revealed) if q else None  # live_beat._watch reruns the page when it moves
    if q is None:
        return
    st.subheader("The presenter asks: what comes next?")
    st.code(q.prompt, language=None, wrap_lines=True)
    if q.revealed:
        tally = q.tally()  # as projected: without the answers the presenter hid
        top = next(iter(tally), None)
        st.success(
            f"The model's answer: {lit(repr(q.answer))}."
            + (f" The class's most common guess: {lit(repr(top))} ({tally[top]} of {sum(tally.values())})." if top else "")
        )
        return
    with st.form(f"live_guess_{q.number}", border=False):
        cols = st.columns(2)
        picked = cols[0].selectbox("Pick one", ["—", *q.options], key=f"live_pick_{q.number}")
        typed = "" if q.choices_only else cols[1].text_input("… or type a word", key=f"live_type_{q.number}", max_chars=40)
        if st.form_submit_button("Send my guess"):
            try:
                kept = live.classes().answer(code, session_key(), typed or ("" if picked == "—" else picked))
                st.session_state["_live_sent"] = (q.number, kept)
            except ValueError as e:
                st.warning(str(e))
    sent = st.session_state.get("_live_sent")
    if sent and sent[0] == q.number:
        st.caption(f"Your guess: {lit(repr(sent[1]))}. You can change it until the presenter reveals the answer.")
