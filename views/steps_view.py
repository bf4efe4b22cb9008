"""The generation page's decode loop seen from the KV cache (issue 57): a recorded generation (pipeline.generation.
steps, on the model's own thread, shared by every visitor for the same model, prompt and length), a step slider with
play, a layer, every head's newest query over every cached key, the cache at that step, the step's time beside the
prefill's, the token chosen; and the check that each row is the last row of a full eager forward over the same ids."""

from __future__ import annotations

import streamlit as st

import appstate
from components.steps_figures import cache_strip_figure, step_attention_figure
from components.tokens import lit, visible
from hosting import demo
from pipeline import text_of
from pipeline.generation import steps
from pipeline.lab import checks
from views import proof, render
from views.guard import address_slot, allowed
from views.loading import model_key

MAX_STEPS = 32


@st.cache_resource(show_spinner=False)
def _recorded() -> appstate.LRU:
    return appstate.LRU(16)


def _advance() -> None:
    n = st.session_state.get("_steps_n", 1)
    st.session_state["steps_step"] = (int(st.session_state.get("steps_step", 0)) + 1) % max(1, n)


@st.fragment(run_every="1.5s")
def _player() -> None:
    """While "Play" is on: the next step every 1.5 s (the whole section redrawn)."""
    if st.session_state.get("steps_play"):
        _advance()
        st.rerun(scope="app")


def section(lm) -> None:
    st.subheader("The loop, step by step: what each new token's query reads from the KV cache")
    st.markdown(
        "After the first token the model runs on **one** new token per step. Its query attends over the keys kept for "
        "every token before it (the prompt's, computed once by the prefill, and each generated token's, computed at its "
        "own step) plus its own: only the newest key and value are computed; every other one is read back from the cache."
    )
    prompt, chat = st.session_state.get("prompt", ""), bool(st.session_state.get("chat"))
    n = st.slider("Decode steps to record", 2, MAX_STEPS, 12, key="steps_new", bind="query-params", help="Greedy decoding, as generate does")
    key = (model_key(), prompt, chat, n)
    got = _recorded().peek(key)
    # a toggle bound to the link, not a button: a shared link and a live class's view carry "recorded", so a follower
    # (or a link's visitor) gets the presenter's recording (one per process: single flight) and its step
    on = st.toggle(
        "Record the decode steps", key="steps_on", bind="query-params", help="One prefill and then one token at a time, every layer's newest query kept"
    )
    if got is None:
        if not on:
            st.caption("Recording keeps one row per head and layer at every step; a generation nobody records keeps nothing.")
            return
        if key not in _recorded() and not allowed("recording the decode steps"):
            return
        try:
            with address_slot(), st.spinner("Recording each decode step's attention…"):
                got = _recorded().get(key, lambda: lm.run(lambda progress=None: steps(lm, prompt, new=n, chat=chat)))
        except demo.Busy as e:
            st.warning(str(e))
            return
    elif not on:
        return
    st.session_state["_steps_n"] = len(got.steps)
    L, P = lm.facts.n_layers, len(got.prompt_ids)
    c = st.columns([3, 2, 1])
    step = c[0].slider(
        "Step", 0, len(got.steps) - 1, 0, key="steps_step", bind="query-params", help="Step 0: the prompt's last query; step s: the s-th generated token's"
    )
    layer = c[1].slider("Layer", 0, L - 1, L - 1, key="steps_layer", bind="query-params")
    c[2].toggle("Play", key="steps_play", help="Walk the steps, one every 1.5 s")
    c[2].button("Next step", key="steps_next", on_click=_advance, icon=":material/skip_next:")
    _player()
    s = got.steps[step]
    labels = [text_of(lm.tokenizer, [t]) for t in got.ids[: s.cache_len]]
    m = st.columns(4)
    m[0].metric("Keys in the cache", f"{s.cache_len:,}", help=f"{P} from the prompt, {s.cache_len - P} generated")
    m[1].metric("KV cache", f"{s.kv_bytes / 2**10:,.0f} KiB", help="2 (K and V) x KV heads x head dim x bytes x layers x tokens")
    m[2].metric("This step", f"{s.seconds * 1000:.1f} ms", help=f"The prefill (step 0) took {got.steps[0].seconds * 1000:.1f} ms over {P} tokens")
    m[3].metric("Token chosen", lit(repr(visible(s.token))), help=f"p = {s.p:.3f}, id {s.token_id}")
    render.figure(step_attention_figure(s.attention[layer], labels, P, step, layer), "decode step attention", settings={"step": step, "layer": layer})
    render.figure(cache_strip_figure(P, s.cache_len, step), "kv cache at step")
    st.caption(
        "Prompt tokens are left of the dashed line; the red column is the new token's own key, computed this step; every other column is read from the cache."
    )
    proof.how_do_we_know(lambda: [checks.check_step(lm, got, step)], f"steps-{step}", got, ask=True)
