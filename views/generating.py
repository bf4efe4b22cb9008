"""The generation pages' controls and their one generation controller: sampling settings bound to the link, a
request streamed into the page (pipeline.serving.stream decides who serves it), every event kept in the session
as it arrives so a Stop loses nothing, and the live panel of the shared engine."""

from __future__ import annotations

import streamlit as st

import appstate
import pipeline
from components.tokens import visible
from hosting import demo
from pipeline import DEFAULTS, Sampling, TraceError, serving, text_of
from pipeline.decode_step import precision
from pipeline.generation import MAX_NEW_TOKENS, GenerationRecord, Phase, prepare
from pipeline.serving import Route
from views import loading, render
from views.guard import address_slot, allowed, cap, cap_note
from views.loading import model_key
from views.render import verbatim
from views.runs import heavy

# prompts the embedded model answers well when generating (greedy, 48 tokens: no loop, a real answer); the
# completion-style default ("The capital of France is") is made for the single next token of the pages before generation
GENERATION_PRESETS = {
    "Why is the sky blue?": ("Why is the sky blue?", True),
    "A haiku": ("Write a haiku about the sea.", True),
    "Python code": ("Write a Python function that adds two numbers.", True),
}


def _use_preset(name: str) -> None:
    st.session_state["prompt"], st.session_state["chat"] = GENERATION_PRESETS[name]
    st.session_state["preset"] = "—"


def generation_presets(where=None) -> None:
    """One-click prompts that generate well on the embedded model (they set the sidebar's prompt and chat mode)."""
    w = where or st
    cols = w.columns(len(GENERATION_PRESETS) + 1)
    cols[0].caption("Prompts that generate well:")
    for c, name in zip(cols[1:], GENERATION_PRESETS):
        c.button(name, key=f"genpreset_{name}", on_click=_use_preset, args=(name,), type="tertiary", icon=":material/edit_note:")


def generation_prompt() -> str | None:
    """The sidebar's prompt for a generation page; None (with a message in the page) when it is empty."""
    prompt = st.session_state.get("prompt", "") or ""
    if not prompt.strip():
        st.info("The sidebar's prompt is empty: type one (or pick a preset) to generate.")
        return None
    return prompt


def sampling_sliders(cols, keys: tuple[str, str, str, str, str], seed_col=None, greedy_default: bool = False) -> Sampling:
    """The one set of sampling controls (the Next token page and the generation pages): temperature / top-k / top-p
    / min-p in `cols`, the seed in `seed_col` (default the fifth column), starting from the app's one set of defaults
    (pipeline.forward.sampling.DEFAULTS), each bound to the link under its key in `keys`."""
    d, q = DEFAULTS, dict(bind="query-params")
    kt, kk, kp, km, ks = keys
    return Sampling(
        temperature=cols[0].slider("Temperature", 0.0, 2.0, 0.0 if greedy_default else d.temperature, 0.05, key=kt, help="0 = greedy", **q),
        top_k=cols[1].slider("Top-k (0 = off)", 0, 200, d.top_k, key=kk, **q),
        top_p=cols[2].slider("Top-p (1 = off)", 0.0, 1.0, d.top_p, 0.01, key=kp, **q),
        min_p=cols[3].slider("Min-p (0 = off)", 0.0, 0.5, d.min_p, 0.01, key=km, **q),
        seed=int((seed_col if seed_col is not None else cols[4]).number_input("Seed", 0, 2**31 - 1, d.seed, key=ks, **q)),
    )


def sampling_controls(prefix: str, greedy_default: bool = False) -> tuple[int, Sampling]:
    """(max new tokens, Sampling): max new tokens, then the sampling controls, in one row."""
    c = st.columns(6)
    n = c[0].number_input(
        "Max new tokens",
        0,
        cap("new_tokens", MAX_NEW_TOKENS),
        min(48, cap("new_tokens", MAX_NEW_TOKENS)),
        key=f"{prefix}_n",
        help=f"Capped at {cap('new_tokens', MAX_NEW_TOKENS):,}." + cap_note("new_tokens"),
        bind="query-params",
    )
    keys = (f"{prefix}_t", f"{prefix}_k", f"{prefix}_p", f"{prefix}_minp", f"{prefix}_seed")
    return n, sampling_sliders(c[1:], keys, greedy_default=greedy_default)


def run_generation(
    lm, prompt: str, chat: bool, max_new_tokens: int, sampling: Sampling, slot: str, out=None, sampler=None, use_cache: bool = True, route: Route = Route.ENGINE
) -> GenerationRecord | None:
    """Stream one generation into `out` (a placeholder), keeping every event in the session's `slot` as it
    arrives, so a Stop (which reruns the page) loses nothing. Returns the record, or None on bad input.
    route "engine": the request joins the shared engine (every visitor's requests batched together); while it
    waits in line the page says where it stands. Other routes: this request's own loop (pipeline.serving)."""
    if not allowed("generating"):
        return None
    try:
        with address_slot():
            return _stream(lm, prompt, chat, max_new_tokens, sampling, slot, out, sampler, use_cache, route)
    except demo.Busy as e:
        st.warning(str(e))
        return None


def _stream(lm, prompt, chat, max_new_tokens, sampling, slot, out, sampler, use_cache, route) -> GenerationRecord | None:
    try:  # a bad prompt (empty, too long), a full queue, a request too large for the KV memory: a message, nothing runs
        req = prepare(lm, prompt, max_new_tokens, chat, max_prompt_tokens=cap("prompt_tokens"))
        events = serving.stream(lm, req, sampling, route, use_cache)
    except (TraceError, pipeline.engine.QueueFull, pipeline.engine.TooLarge, ValueError) as e:
        st.warning(str(e))
        return None
    for note in req.notes:
        st.info(note)
    rec = GenerationRecord(
        prompt=prompt, chat=chat, model=lm.label, max_new_tokens=req.max_new_tokens, sampling=sampling, prompt_tokens=len(req.prompt_ids), use_cache=use_cache
    )
    t_start = events.t0
    appstate.remember(st.session_state, slot, model_key(), rec)
    try:
        for ev in events:
            if rec.stopped:  # Stop was pressed: the page has moved on, keep what it showed (the engine
                break  # request is cancelled as the stream closes)
            if isinstance(ev, serving.Waiting):
                if out is not None:
                    out.info(f"Waiting in line: {ev}. Your request starts as soon as a slot is free.")
                continue
            rec.events.append(ev)
            if sampler is not None:
                first = ev.phase == Phase.PREFILL
                sampler.mark(str(ev.phase), t_start if first else t_start + ev.t_s - ev.step_s, t_start + ev.t_s)
            if out is not None:
                verbatim(rec.text(), out, cursor=True)
    except pipeline.engine.EngineError as e:  # a replica that died, an engine error: what was made is kept
        st.warning(str(e))
        rec.stopped = True
    finally:
        events.close()
        rec.busy = events.busy  # what else ran meanwhile
    rec.done = not rec.stopped
    if out is not None:
        verbatim(rec.text(), out)
    return rec


def last_generation(slot: str, lm) -> GenerationRecord | None:
    """This session's last generation in `slot` for the loaded model, if it produced anything."""
    rec = appstate.recall(st.session_state, slot, model_key())
    return rec if rec is not None and rec.model == lm.label and rec.events else None


def stop_generation(slot: str) -> None:
    """The Stop button: the running generation in `slot` stops after its current token, keeping what it made."""
    rec = appstate.recall(st.session_state, slot, model_key())
    if rec is not None and not rec.done:
        rec.stopped = True


# what the pages say of the weights a model serves (pipeline.load_model's precision): the lesson's one table
PRECISION_NOTES = precision.PRECISION_NOTES


def beside_fp32(lm, rec: GenerationRecord, slot: str) -> None:
    """Where a model in another precision than fp32 (an int8 model) served `rec`: the precision that served, and on
    request (a button: it may load the fp32 model) its answer beside fp32's: the same prompt and answer through both
    models' forward (pipeline.decode_step.cpu.precision.beside_fp32), the positions whose greedy choice differs and the largest
    logit difference."""
    if lm.precision == "fp32":
        return
    st.subheader(f"Served in {lm.precision}, beside fp32")
    st.caption(f"{lm.label} served this answer in {PRECISION_NOTES.get(lm.precision, lm.precision)}: {precision.served_note(lm)}.")
    toks = [e.token_id for e in rec.events]
    ask = loading.Ask(f"{slot}/beside_fp32", (lm.key, rec.prompt, rec.chat, tuple(toks)))
    d = loading.kept(ask)
    if d is None:
        if not st.button("Compare with fp32", key=f"{slot}_fp32", icon=":material/compare:", help="Loads the fp32 model if it is not loaded (seconds)"):
            return
        with heavy(f"comparing {lm.precision} with fp32", slot=f"{slot}_fp32"):
            fp32 = loading.fp32_model(lm)
            if fp32 is None:
                return
            try:
                ids = prepare(lm, rec.prompt, len(toks), rec.chat).prompt_ids
                d = loading.run(ask, lambda: precision.beside_fp32(fp32, lm, ids, toks))
            except (TraceError, ValueError) as e:
                st.warning(str(e))
                return
    c = st.columns(3)
    c[0].metric("Tokens that differ from fp32", f"{len(d.differing)} of {d.positions}", help="Answer positions where fp32's greedy choice is another token")
    c[1].metric("Largest logit difference", f"{d.max_logit_diff:.3f}", help=f"|int8 − fp32| over every position and the whole vocabulary; at position {d.at}")
    c[2].metric("First differing position", d.differing[0] if d.differing else "none")
    piece = lambda t: repr(visible(text_of(lm.tokenizer, [t])))  # noqa: E731 - the model's text, shown as written
    rows = [
        {
            "position": i,
            f"{lm.precision}'s greedy pick": piece(d.picks[i]),
            "fp32's greedy pick": piece(d.ref_picks[i]),
            "largest |Δ logit| here": round(d.per_position[i], 3),
        }
        for i in d.differing[:20]
    ]
    if rows:
        render.table(f"{slot}_beside_fp32", rows, hide_index=True, width="stretch")
    st.caption(
        f"What was compared: the prompt and this answer's {d.positions} tokens fed through both models' own forward "
        f"(transformers), {lm.label} and the same model in fp32 (the weights it was quantised from), the same context at every position (teacher "
        "forcing). A token differs where the two greedy choices differ; the logit difference is the largest over every "
        "position and the whole vocabulary."
        + ("" if rec.sampling.greedy else " This answer was sampled: the greedy choices are compared, not the sampled tokens.")
    )


@st.fragment(run_every="2s")
def engine_panel(lm):
    """What the shared engine is serving for this app right now (every visitor's generations), refreshed."""
    s = pipeline.engine.engine_for(lm).stats()
    st.subheader("Live: this server's engine")
    c = st.columns(4)
    c[0].metric("Requests running", s.running)
    c[1].metric("Waiting in line", s.waiting)
    c[2].metric("Tokens/s, last minute", f"{s.tokens_per_s_last_minute:.1f}")
    c[3].metric("KV memory in use", f"{s.kv_bytes_in_use / 2**20:,.1f} of {s.kv_bytes_total / 2**20:,.0f} MiB", help=f"{s.blocks_used} of {s.blocks} blocks")
    hits = s.prefix_hit_requests
    st.caption(
        f"{s.engine}, serving {lm.label} in {PRECISION_NOTES.get(lm.precision, lm.precision)}: every visitor's generations on the "
        f"generation, hardware and streaming pages go through it. {s.iterations:,} iterations so far. "
        f"Prefix cache: {hits:,} {'prompt' if hits == 1 else 'prompts'} started like an earlier one and reused "
        f"{s.prefix_hit_tokens:,} tokens of K/V instead of computing them ({s.blocks_cached:,} blocks cached)."
    )
