"""The Streamlit side of the shared state: the sidebar, the model and traces a page reads, and the widgets
several pages share. The state itself (loaders, trace cache, a page's last run) lives in `appstate`, which
knows nothing of Streamlit; this module only holds one instance per process or per session.

Pages stay thin: they read widgets, call pipeline, hand plain data to components.
"""

from __future__ import annotations

import time

import streamlit as st

import appstate
import pipeline
from pipeline.generation import GenerationRecord, prepare
from pipeline.models import ModelLoadError, available_models, canonical_key
from pipeline.tracing import TraceError, check_prompt

PRESETS = {
    "Why is the sky blue?": ("Why is the sky blue?", True),
    "The capital of France is": ("The capital of France is", False),
    "Apple released a new chip.": ("Apple released a new chip.", False),
    "Apple fell from the tree.": ("Apple fell from the tree.", False),
    "Dog bites man.": ("Dog bites man.", False),
    "Man bites dog.": ("Man bites dog.", False),
    "The cat sat on the mat because it was warm.": ("The cat sat on the mat because it was warm.", False),
    "Emoji, Hindi and code": ("Hi 👋🏽! नमस्ते दुनिया\ndef add(a, b):\n    return a + b", False),
}
LOCAL = "Local folder…"
DEFAULTS = {"prompt": "The capital of France is", "chat": False, "model_choice": pipeline.EMBEDDED, "local_path": ""}


@st.cache_resource(show_spinner=False)
def _loaders() -> appstate.Loaders:
    return appstate.Loaders(max_models=4)


def _loader(key: str) -> appstate.Loader:
    return _loaders().get(key)


def _init_state():
    for k, v in DEFAULTS.items():
        st.session_state.setdefault(k, v)


def _prompt_edited():
    """A typed prompt is no longer the preset: the preset box says so."""
    name = st.session_state.get("preset")
    if name in PRESETS and PRESETS[name][0] != st.session_state.get("prompt"):
        st.session_state["preset"] = "—"


def _apply_preset():
    name = st.session_state.get("preset")
    if name in PRESETS:
        st.session_state["prompt"], st.session_state["chat"] = PRESETS[name]


def sidebar():
    _init_state()
    sb = st.sidebar
    choices = [m for m in available_models()]
    labels = {m.key: m.label + ("" if m.available else " (not installed)") for m in choices}
    keys = [m.key for m in choices] + [LOCAL]
    sb.selectbox(
        "Model",
        keys,
        key="model_choice",
        format_func=lambda k: labels.get(k, k),
        help="Embedded SmolLM2-135M-Instruct, Gemma-3 270M after `make models`, or any local Hugging Face folder (safetensors). Nothing is ever downloaded.",
    )
    if st.session_state["model_choice"] == LOCAL:
        sb.text_input("Folder path", key="local_path", placeholder="/path/to/hf-model-folder")
    sb.selectbox("Preset prompt", ["—"] + list(PRESETS), key="preset", on_change=_apply_preset)
    sb.text_area("Prompt", key="prompt", height=110, max_chars=200_000, on_change=_prompt_edited)
    sb.toggle("Chat mode (wrap in the chat template)", key="chat")
    info = st.session_state.get("_device_label")
    if info:
        sb.caption(f"**Device:** {info}")
    st.session_state["_run_caption"] = sb.empty()  # one "This run" line, however many traces a page reads


def model_key() -> str:
    choice = st.session_state.get("model_choice") or pipeline.EMBEDDED
    if choice == LOCAL:
        path = st.session_state.get("local_path", "").strip()
        return canonical_key(path) if path else ""
    return choice


def get_model():
    """The loaded model for the sidebar's choice (shared by all tabs), with progress while it loads.
    Stops the page with a clear message when it cannot load."""
    key = model_key()
    if not key:
        st.info("Type the path of a local Hugging Face model folder in the sidebar.")
        st.stop()
    try:
        pipeline.models.check_folder(key) if key not in (pipeline.EMBEDDED, pipeline.GEMMA) else None
    except ModelLoadError as e:
        st.error(str(e))
        st.stop()
    lm = _wait_loaded(key, "the model")
    if lm is None:
        st.stop()
    if st.session_state.get("_device_label") != lm.device_label:
        st.session_state["_device_label"] = lm.device_label
        st.sidebar.caption(f"**Device:** {lm.device_label}")
    return lm


@st.cache_resource(show_spinner=False)
def _traces() -> appstate.TraceCache:
    return appstate.TraceCache()


def _trace(model_key: str, prompt: str, chat: bool, qkv_layer: int | None, progress=None):
    lm = _loader(model_key).result
    return _traces().get(
        (model_key, prompt, chat, qkv_layer),
        lambda: pipeline.trace(
            lm,
            prompt,
            chat=chat,
            qkv_layers=[qkv_layer] if qkv_layer is not None else None,
            attn_layers=None if qkv_layer is None else [qkv_layer],
            progress=progress,
        ),
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
        nxt, p = pipeline.sampling.top_token(tr.next_logits)
        where = st.session_state.get("_run_caption") or st.sidebar
        where.caption(f"**This run:** {tr.T:,} tokens → most likely next token **{lm.tokenizer.decode([nxt])!r}** (p = {p:.2f})")
    return lm, tr


@st.cache_resource(show_spinner=False, max_entries=16)
def _tokenized(model_key: str, prompt: str, chat: bool):
    return pipeline.tokenize(_loader(model_key).result.tokenizer, prompt, chat=chat)


def get_tokens():
    """(lm, tokenized prompt, message or None): tokenizing works at any length; the message says when the
    prompt is too long for the model to run on."""
    lm = get_model()
    prompt, chat = st.session_state.get("prompt", ""), bool(st.session_state.get("chat"))
    try:
        check_prompt(prompt)
    except TraceError as e:
        st.warning(str(e))
        st.stop()
    tk = _tokenized(model_key(), prompt, chat)
    try:
        check_prompt(prompt, len(tk.tokens), lm.facts.max_positions)
        msg = None
    except TraceError as e:
        msg = str(e)
    return lm, tk, msg


# Widget callbacks: never a function or lambda defined in a page script. Streamlit keeps each widget's
# format_func / on_change in the session's widget metadata, and a page-level function holds the page's whole
# namespace (its trace, its results) through __globals__; a widget whose options change with the prompt gets a
# new entry per prompt, so one session used to keep every trace it ever saw (~210 MB per long prompt). These
# helpers close over plain data only.
def labeller(labels) -> callable:
    """format_func for options 0..n-1 (or the keys of a dict) that shows labels[option]."""
    return (list(labels) if not isinstance(labels, dict) else dict(labels)).__getitem__


def on_choice(select_key: str, table: dict, targets: tuple[str, ...]) -> callable:
    """on_change for a selectbox `select_key` whose choice fills other widgets: table[choice] -> one value per
    target session-state key (a single target takes the value itself)."""

    def fill():
        vals = table[st.session_state[select_key]]
        st.session_state.update({targets[0]: vals} if len(targets) == 1 else dict(zip(targets, vals)))

    return fill


PASS, FAIL, SKIP = (":green[:material/check_circle:]", ":red[:material/cancel:]", ":gray[:material/remove_circle: not run]")


def verdict(ok: bool | None) -> str:
    """A pass / fail / not-run mark drawn with Streamlit's bundled icon font (no emoji font needed)."""
    return SKIP if ok is None else (PASS if ok else FAIL)


def _check_results() -> appstate.CheckResults:
    return st.session_state.setdefault("_checks", appstate.CheckResults())


def how_do_we_know(checks_fn, key: str, tr, label="How do we know? Cross-checks on this run", ask: bool = False):
    """An expander that runs `checks_fn()` -> [Check] once per `tr` (a trace, or a run's result object) and shows
    each measured discrepancy. Results live in the session (appstate.CheckResults), never on the shared trace.
    Checks that need extra forward passes on long prompts (or, with `ask`, always) wait for a click."""
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
                results = checks_fn()
            except Exception as e:  # noqa: BLE001 - a failed check is shown, the page keeps serving
                st.error(f"A check could not run: {type(e).__name__}: {e}")
                return
            store.put(key, tr, results)
        for c in results:
            st.markdown(f"{verdict(c.ok)} **{c.name}** — {c.detail}")


@st.cache_resource(show_spinner="Loading tokenizer…")
def tokenizer_for(key: str):
    return pipeline.models.load_tokenizer(key)


def layer_with_qkv(tr, label: str, key: str, default: int | None = None):
    """A layer picker for views that need the layer's Q/K/V. Short prompts have them for every layer; long
    ones for a few kept layers, and another layer is captured on request (one more forward pass, which keeps
    the default layers too). Returns (trace, layer)."""
    L = tr.facts.n_layers
    if len(tr.qkv) == L:
        return tr, st.slider(label, 0, L - 1, L // 2 if default is None else default, key=key)
    extra_key = (f"{key}_extra", st.session_state.get("prompt"), model_key())
    extra = st.session_state.get(str(extra_key))
    if extra is not None and extra not in tr.qkv:
        _, tr = get_trace(qkv_layer=extra)
    options = sorted(tr.qkv)
    if len(options) > 1:
        layer = st.select_slider(label, options, value=extra if extra in options else options[len(options) // 2], key=key)
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


def chat_switch(lm, key: str, where=None) -> bool:
    """The generation pages' "Chat mode" switch. Each page has its own widget, but they share one preference,
    so turning it off on page 6 also turns it off on the KV, hardware, production and streaming pages. On by
    default for instruct models (they answer a question); off and disabled for base models."""
    has = bool(getattr(lm.tokenizer, "chat_template", None))

    def keep():
        st.session_state["_gen_chat"] = st.session_state[key]

    w = where or st
    return w.toggle(
        "Chat mode",
        value=bool(st.session_state.get("_gen_chat", True)) and has,
        key=key,
        disabled=not has,
        on_change=keep,
        help="For the generation pages (6-14; the sidebar's switch applies to pages 1-5): the sidebar's "
        "prompt wrapped in the chat template. Instruct models answer questions in chat mode; a "
        "completion-style prompt such as 'The capital of France is' reads better with it off. "
        "Base models have no chat template.",
    )


def generation_prompt() -> str | None:
    """The sidebar's prompt for a generation page; None (with a message in the page) when it is empty."""
    prompt = st.session_state.get("prompt", "") or ""
    if not prompt.strip():
        st.info("The sidebar's prompt is empty: type one (or pick a preset) to generate.")
        return None
    return prompt


def sampling_controls(prefix: str, greedy_default: bool = False) -> dict:
    """Temperature / top-k / top-p / seed / max new tokens in one row (shared by the generation pages)."""
    c = st.columns(5)
    return dict(
        max_new_tokens=c[0].number_input("Max new tokens", 0, 100_000, 48, key=f"{prefix}_n", help=f"Capped at {pipeline.generation.MAX_NEW_TOKENS}"),
        temperature=c[1].slider("Temperature", 0.0, 2.0, 0.0 if greedy_default else 0.7, 0.05, key=f"{prefix}_t", help="0 = greedy"),
        top_k=c[2].slider("Top-k (0 = off)", 0, 200, 50, key=f"{prefix}_k"),
        top_p=c[3].slider("Top-p (1 = off)", 0.0, 1.0, 0.95, 0.01, key=f"{prefix}_p"),
        seed=c[4].number_input("Seed", 0, 2**31 - 1, 0, key=f"{prefix}_seed"),
    )


def run_generation(
    lm, prompt: str, chat: bool, settings: dict, slot: str, out=None, sampler=None, use_cache: bool = True, cache: str = "engine"
) -> GenerationRecord | None:
    """Stream one generation into `out` (a placeholder), keeping every event in the session's `slot` as it
    arrives, so a Stop (which reruns the page) loses nothing. Returns the record, or None on bad input.
    cache "engine": the request joins the shared engine (every visitor's requests batched together); while it
    waits in line the page says where it stands. Other caches: this request's own loop (pipeline.generate)."""
    try:
        req = prepare(lm, prompt, settings["max_new_tokens"], chat)
    except TraceError as e:
        st.warning(str(e))
        return None
    for note in req.notes:
        st.info(note)
    rec = GenerationRecord(prompt=prompt, chat=chat, model=lm.label, settings=dict(settings), prompt_tokens=len(req.prompt_ids), use_cache=use_cache)
    t_start = time.perf_counter()
    opts = {k: v for k, v in settings.items() if k != "max_new_tokens"}
    if use_cache and cache == "engine":
        try:
            events = pipeline.engine.engine_for(lm).submit(req.prompt_ids, req.max_new_tokens, pipeline.engine.Sampling(**opts), arrived=t_start).stream()
        except (pipeline.engine.QueueFull, pipeline.engine.TooLarge, ValueError) as e:
            st.warning(str(e))
            return None
    else:
        events = pipeline.generate(lm, prompt, chat=chat, request=req, use_cache=use_cache, cache=cache, **opts)
    appstate.remember(st.session_state, slot, model_key(), rec)
    for ev in events:
        if rec.stopped:  # Stop was pressed: the page has moved on, keep what it showed (the engine
            break  # request is cancelled as the stream closes)
        if isinstance(ev, pipeline.engine.Waiting):
            if out is not None:
                out.info(f"The server is busy: {ev}. Your request starts as soon as a slot is free.")
            continue
        rec.events.append(ev)
        if sampler is not None:
            sampler.mark("prefill" if ev.phase == "prefill" else "decode", t_start if ev.phase == "prefill" else t_start + ev.t_s - ev.step_s, t_start + ev.t_s)
        if out is not None:
            out.markdown(rec.text(lm.tokenizer) + " ▌")
    rec.done = not rec.stopped
    if out is not None:
        out.markdown(rec.text(lm.tokenizer))
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


def remember(slot: str, value) -> None:
    """Keep a page's last result (a sweep, a comparison) for this session and the loaded model."""
    appstate.remember(st.session_state, slot, model_key(), value)


def recall(slot: str):
    """The page's last result for the loaded model, or None."""
    return appstate.recall(st.session_state, slot, model_key())


def load_other_model(key: str):
    """Load a second model (e.g. a draft) with progress; a clear message and None when it cannot load."""
    try:
        pipeline.models.check_folder(key)
    except ModelLoadError as e:
        st.error(str(e))
        return None
    return _wait_loaded(key, "the draft model")


def _wait_loaded(key: str, what: str):
    """The loaded model for `key`, with a progress bar while it loads; None (and a message) if it failed."""
    ldr = _loader(key)
    if not ldr.done.is_set():
        bar = st.progress(0.0, text=f"Loading {what}…")
        while not ldr.done.wait(0.25):
            bar.progress(min(1.0, ldr.fraction), text=f"{ldr.message} · {time.time() - ldr.t0:.0f} s")
        bar.empty()
    if ldr.error:
        _loaders().forget(key)  # only this one: every other loaded model stays for every session
        st.error(f"Could not load {what}: {ldr.error}")
        return None
    return ldr.result


@st.fragment(run_every="2s")
def engine_panel(lm):
    """What the shared engine is serving for this app right now (every visitor's generations), refreshed."""
    s = pipeline.engine.engine_for(lm).stats()
    st.subheader("Live: this server's engine")
    c = st.columns(4)
    c[0].metric("Requests running", s["running"])
    c[1].metric("Waiting in line", s["waiting"])
    c[2].metric("Tokens/s, last minute", f"{s['tokens_per_s_last_minute']:.1f}")
    c[3].metric(
        "KV memory in use", f"{s['kv_bytes_in_use'] / 2**20:,.1f} of {s['kv_bytes_total'] / 2**20:,.0f} MiB", help=f"{s['blocks_used']} of {s['blocks']} blocks"
    )
    st.caption(f"{s['engine']}: every generation on pages 6, 9 and 14 of every visitor goes through it. {s['iterations']:,} iterations so far.")
