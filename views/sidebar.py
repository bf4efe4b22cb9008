"""The sidebar every page shares: the model, a preset or typed prompt, chat mode, sharing the view, the device."""

from __future__ import annotations

from pathlib import Path

import streamlit as st

import appstate
import pipeline
from pipeline.model import available_models
from views import guard, live, session
from views.guard import _sessions, cap_note
from views.loading import LOCAL
from views.session import session_key

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


DEFAULTS = {"prompt": "The capital of France is", "chat": False, "model_choice": pipeline.model.DEFAULT, "local_path": ""}


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


def _folder_label(key: str) -> str:
    """An allowlisted folder's label: its name, and "(int8)" for its int8 variant (a key ending ":int8")."""
    base, precision = pipeline.model.split_precision(key)
    name = Path(base or key).name
    return pipeline.model.int8_label(name) if precision == "int8" else name


def sidebar():
    _init_state()
    session.keep_runs()
    long = session.shared_prompt()
    sb = st.sidebar
    pol = guard.policy()
    _sessions().seen(session_key())
    if pol.enabled:  # only the operator's allowlist; nothing a visitor types is ever a server path
        known = {m.key: m for m in available_models(int8=True)}
        choices = [known.get(k) or pipeline.model.ModelChoice(k, _folder_label(k), True) for k in pol.models]
        keys = [m.key for m in choices]
        if st.session_state.get("model_choice") not in keys:
            st.session_state["model_choice"] = keys[0]
        helptext = "The models this demo server offers (chosen by its operator). Nothing is ever downloaded."
    else:
        choices = available_models(int8=True)
        keys = [m.key for m in choices] + [LOCAL]
        helptext = (
            "Embedded SmolLM2-135M-Instruct, Gemma-3 270M after `make models`, or any local Hugging Face folder (safetensors). "
            "An “int8” entry is the same model served with int8 weight-only matrices (a folder: its path ending “:int8”). "
            "Nothing is ever downloaded."
        )
    labels = {m.key: m.label + ("" if m.available else " (not installed)") for m in choices}
    led = live.following()  # the presenter sets the model, prompt and chat mode: shown here, not editable
    if led:
        sb.caption("You follow a live class: the model, prompt and chat mode are the presenter's. “Explore on my own” to change them.")
    sb.selectbox("Model", keys, key="model_choice", bind="query-params", format_func=lambda k: labels.get(k, k), help=helptext, disabled=led)
    if st.session_state["model_choice"] == LOCAL:
        roots = ", ".join(str(r) for r in appstate.models_roots())
        sb.text_input(
            "Folder path or Hugging Face id",
            key="local_path",
            placeholder=f"{roots.split(', ')[0]}/my-model or HuggingFaceTB/SmolLM2-360M",
            help=f"A Hugging Face model folder under {roots} (config.json + *.safetensors), or the id of a model in the local "
            "Hugging Face cache. Nothing is downloaded; its size and this machine's free memory are said before it loads.",
        )
    if led:
        _prompt_edited()  # the presenter's prompt is in the box: the preset box says whether it is one
    sb.selectbox("Preset prompt", ["—"] + list(PRESETS), key="preset", on_change=_apply_preset, disabled=led)
    sb.text_area(
        "Prompt",
        key="prompt",
        height=110,
        max_chars=200_000,
        on_change=_prompt_edited,
        bind=None if long else "query-params",
        disabled=led,
        help="Any text: it is shown as typed, never read as Markdown or HTML." + cap_note("prompt_tokens", "tokens"),
    )
    sb.toggle(
        "Chat mode (wrap in the chat template)",
        key="chat",
        bind="query-params",
        disabled=led,
        help="One switch for every page: the prompt wrapped in the model's chat template (instruct models answer "
        "questions in chat mode; a completion such as 'The capital of France is' reads better without it).",
    )
    session.share_note(sb, long)
    info = st.session_state.get("_device_label")
    if info:
        sb.caption(f"**Device:** {info}")
    st.session_state["_run_caption"] = sb.empty()  # one "This run" line, however many traces a page reads
