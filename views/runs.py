"""What a page reads: the loaded model (shared by every visitor, loaded once per process with progress), the shared
trace of a prompt, its tokens, a second model, the layer picker for views that need a layer's Q/K/V, and the
operator's view of it all. Each new model run counts against the visitor's limits (views.guard)."""

from __future__ import annotations

import datetime
from contextlib import contextmanager

import streamlit as st

import appstate
import pipeline
from components.tokens import lit
from hosting import demo
from hosting.store import StoreDown, shared
from pipeline import TraceError, text_of
from pipeline.common import ACTIVITY
from pipeline.engine import ordinal
from pipeline.forward import check_prompt
from views import guard
from views.guard import _errors, _heavy_line, _sessions, address_slot, allowed, cap
from views.loading import _loader, _loaders, get_model, model_key, remember
from views.session import session_key


@st.cache_resource(show_spinner=False)
def _traces() -> appstate.TraceCache:
    return appstate.TraceCache()


def _trace(model_key: str, prompt: str, chat: bool, qkv_layer: int | None, progress=None):
    """The shared trace for these inputs; a new one counts as a run against the visitor's limits (a cached one
    costs nothing) and is made on the model's own thread (pipeline.model.LoadedModel.run)."""
    lm = _loader(model_key).result
    key = (model_key, prompt, chat, qkv_layer)
    make = lambda: lm.run(_make_trace, lm, prompt, chat, qkv_layer, progress=progress)  # noqa: E731
    if key in _traces():
        return _traces().get(key, make)
    if not allowed("running the model"):
        st.stop()
    try:
        with address_slot():
            return _traces().get(key, make)
    except demo.Busy as e:
        st.warning(str(e))
        st.stop()


def _make_trace(lm, prompt: str, chat: bool, qkv_layer: int | None, progress=None):
    return pipeline.trace(
        lm,
        prompt,
        chat=chat,
        qkv_layers=[qkv_layer] if qkv_layer is not None else None,
        attn_layers=None if qkv_layer is None else [qkv_layer],
        max_tokens=cap("prompt_tokens", pipeline.forward.tracing.DEFAULT_MAX_TOKENS),
        progress=progress,
    )


def get_trace(prompt: str | None = None, chat: bool | None = None, qkv_layer: int | None = None):
    """(lm, trace) for the sidebar's prompt (or the one given); shows a clear message and stops on bad input.
    A progress bar follows the layers while the model runs."""
    lm = get_model()
    own = prompt is None
    prompt = st.session_state.get("prompt", "") if prompt is None else prompt
    chat = bool(st.session_state.get("chat")) if chat is None else chat
    bar = st.empty()
    try:
        check_prompt(prompt)
        tr = _trace(model_key(), prompt, chat, qkv_layer, progress=lambda f, msg: bar.progress(f, text=f"Running the model with hooks: {msg}"))
    except TraceError as e:
        bar.empty()
        st.warning(str(e))
        st.stop()
    bar.empty()
    if chat and not tr.chat and own:
        st.caption("This model has no chat template (a base model), so the prompt is used as plain text.")
    if own:
        nxt, p = pipeline.forward.sampling.top_token(tr.next_logits)
        where = st.session_state.get("_run_caption") or st.sidebar
        where.caption(f"**This run:** {tr.T:,} tokens → most likely next token **{lit(repr(text_of(lm.tokenizer, [nxt])))}** (p = {p:.2f})")
    return lm, tr


@st.cache_resource(show_spinner=False)
def _tokenized() -> appstate.LRU:
    return appstate.LRU(16)


def get_tokens():
    """(lm, tokenized prompt, message or None): tokenizing works at any length (a demo server tokenizes at most
    its tokenize_chars); the message says when the prompt is too long for the model to run on. Tokenizing a new
    prompt counts against the visitor's limits."""
    lm = get_model()
    prompt, chat = st.session_state.get("prompt", ""), bool(st.session_state.get("chat"))
    try:
        check_prompt(prompt)
    except TraceError as e:
        st.warning(str(e))
        st.stop()
    limit = cap("tokenize_chars")
    if limit is not None and len(prompt) > limit:
        st.warning(f"The prompt is {len(prompt):,} characters; this demo server tokenizes at most {limit:,}. Shorten it.")
        st.stop()
    key = (model_key(), prompt, chat)
    if key not in _tokenized() and not allowed("tokenizing"):
        st.stop()
    tk = _tokenized().get(key, lambda: pipeline.tokenize(lm.tokenizer, prompt, chat=chat))
    try:
        check_prompt(prompt, len(tk.tokens), lm.facts.max_positions)
        msg = None
    except TraceError as e:
        msg = str(e)
    return lm, tk, msg


def layer_with_qkv(tr, label: str, key: str, default: int | None = None):
    """A layer picker for views that need the layer's Q/K/V. Short prompts have them for every layer; long
    ones for a few kept layers, and another layer is captured on request (one more forward pass, which keeps
    the default layers too). Returns (trace, layer)."""
    L = tr.facts.n_layers
    kept = tr.acts.layers("blocks.*.attn.hook_q")
    if len(kept) == L:
        return tr, st.slider(label, 0, L - 1, L // 2 if default is None else default, key=key, bind="query-params")
    extra_key = (f"{key}_extra", st.session_state.get("prompt"), model_key())
    extra = st.session_state.get(str(extra_key))
    if extra is not None and extra not in kept:
        _, tr = get_trace(qkv_layer=extra)
    options = tr.acts.layers("blocks.*.attn.hook_q")
    if len(options) > 1:
        layer = st.select_slider(label, options, value=extra if extra in options else options[len(options) // 2], key=key, bind="query-params")
    else:
        layer = options[0]
        st.markdown(f"{label}: **{layer}**")
    c1, c2 = st.columns([1, 3])
    want = c1.number_input("Capture another layer", 0, L - 1, 1, key=f"{key}_want")
    if c2.button(f"Run the model again keeping layer {want} in full ({tr.T:,} tokens: seconds on CPU)", key=f"{key}_go"):
        st.session_state[str(extra_key)] = int(want)
        st.rerun()
    st.caption(
        f"{tr.T:,} tokens: query/key/value and full-resolution maps are kept for layer"
        f"{'s' if len(options) > 1 else ''} {', '.join(map(str, options))} only, to bound memory."
    )
    return tr, layer


def chat_mode(lm, where=None) -> bool:
    """The prompt's chat mode on a page that runs it: the sidebar's one switch (shown, not repeated, so two
    switches can never disagree). Base models have no chat template: plain text whatever the switch says."""
    has = bool(getattr(lm.tokenizer, "chat_template", None))
    on = bool(st.session_state.get("chat")) and has
    (where or st).caption(
        f"Chat mode: **{'on' if on else 'off'}** (the switch under {'*Prompt* at the top' if st.session_state.get('present') else 'the prompt in the sidebar'})"
        if has
        else "Plain text: this model has no chat template (a base model)."
    )
    return on


@contextmanager
def heavy(what: str, slot: str | None = None):
    """A heavy experiment (a sweep, the kernels, production mode, a speculative comparison): on a demo server it
    waits its turn in a fair line (one per visitor, `heavy_at_once` at a time), saying where it stands; a tab
    closed while waiting leaves the line. Elsewhere it just runs. With `slot`, what else ran on the server while
    it ran is kept beside the page's result (busy_note(slot) says it)."""
    p = guard.policy()
    if not p.enabled:
        with timed(slot):
            yield
        return
    if not allowed(what):
        st.stop()
    note = st.empty()
    line = _heavy_line(p.caps.heavy_at_once)
    try:
        slot_held = address_slot()
        slot_held.__enter__()
    except demo.Busy as e:
        note.warning(str(e))
        st.stop()
    try:
        try:
            ticket = line.turn(
                session_key(), what, on_wait=lambda pos: note.info(f"The server runs one heavy experiment at a time: you are {ordinal(pos)} in line.")
            )
            ticket.__enter__()
        except demo.Busy as e:
            note.warning(str(e))
            st.stop()
        note.empty()
        try:
            with timed(slot):
                yield
        finally:
            ticket.__exit__(None, None, None)
    finally:
        slot_held.__exit__(None, None, None)


@contextmanager
def timed(slot: str | None):
    """A timed experiment: registered as one (so other times measured meanwhile say so), and what else ran while it
    ran kept beside the page's result in `slot` (busy_note(slot) says it)."""
    with ACTIVITY.doing("experiment") as job:
        yield
    if slot:
        remember(slot + "/busy", job.busy)


def server_status() -> dict:
    """What the operator page shows: plain numbers from this process's shared state and the store (every process's)."""
    p = guard.policy()
    engines = []
    for key in _loaders().keys():
        ldr = _loader(key)
        if ldr.done.is_set() and ldr.result is not None:
            s = pipeline.engine.engine_for(ldr.result).stats()
            engines.append(
                {
                    "model": ldr.result.label,
                    "running": s.running,
                    "waiting": s.waiting,
                    "tok/s, last minute": round(s.tokens_per_s_last_minute, 1),
                    "KV MiB in use": round(s.kv_bytes_in_use / 2**20, 1),
                    "iterations": s.iterations,
                    "cancelled": s.ended.get("cancelled", 0),
                    "memory GB": round(ldr.result.footprint_bytes / 2**30, 2),
                }
            )
    try:  # every process's visitors and errors, from the store
        shared().ping()
        errors = [(datetime.datetime.fromtimestamp(t).strftime("%H:%M:%S"), rid, where, msg) for t, rid, where, msg in reversed(_errors().items)]
        sessions, store_ok = _sessions().active(), None
    except StoreDown as e:
        errors, sessions, store_ok = [], None, str(e)
    return {
        "store": shared().stats() | {"unreachable": store_ok},
        "sessions": sessions,
        "heavy": _heavy_line(p.caps.heavy_at_once).snapshot(),
        "engines": engines,
        "errors": errors,
        "traces": len(_traces()),
        "trace_bytes": _traces().nbytes,
        "model_budget_gb": _loaders().max_bytes / 2**30,
        "evictions": [
            (datetime.datetime.fromtimestamp(e.at).strftime("%H:%M:%S"), e.label, round(e.nbytes / 2**30, 2), e.why) for e in reversed(_loaders().evictions)
        ],
    }
