"""The loaded models every page shares (one per process, loaded in the background with progress, shared by every
visitor), the sidebar's choice of model, and a page's last result kept for this browser and that model."""

from __future__ import annotations

import time
from dataclasses import dataclass

import streamlit as st

import appstate
import pipeline
from pipeline.model import ModelLoadError, canonical_key
from views import guard
from views.guard import fail

LOCAL = "Local folder…"


@st.cache_resource(show_spinner=False)
def _loaders() -> appstate.Loaders:
    return appstate.Loaders(max_models=4)  # and at most LLM_EXPLORER_MODEL_BUDGET_GB (6 GB) of them


def _say_evictions(key: str) -> None:
    """Say, once, which models the server unloaded to make room for this one (it loads again when picked)."""
    ldrs = _loaders()
    seen = st.session_state.get("_evictions_seen", 0.0)
    new = [e for e in list(ldrs.evictions) if e.at > seen and e.for_key == key]
    if not new:
        return
    st.session_state["_evictions_seen"] = max(e.at for e in new)
    for e in new:
        bound = f"at most {ldrs.max_bytes / 2**30:.1f} GB of models" if e.why == "bytes" else f"at most {ldrs.max_models} models"
        st.info(
            f"To make room, this server unloaded {e.label} ({e.nbytes / 2**30:.2f} GB), the model used least recently: it keeps {bound} "
            "in memory. It loads again, with progress, when someone picks it.",
            icon=":material/memory:",
        )


def _loader(key: str) -> appstate.Loader:
    return _loaders().get(key)


def warm() -> None:
    """Start loading every model of the demo allowlist (each once per process; `make demo` has built their
    caches before the server opened, so this is seconds)."""
    for key in guard.policy().models:
        _loader(key)


def model_key() -> str:
    choice = st.session_state.get("model_choice") or pipeline.model.DEFAULT
    pol = guard.policy()
    if pol.enabled:
        return choice if choice in pol.models else pol.models[0]
    if choice == LOCAL:
        path = st.session_state.get("local_path", "").strip()
        return canonical_key(path) if path else ""
    return choice


def get_model():
    """The loaded model for the sidebar's choice (shared by all tabs), with progress while it loads.
    Stops the page with a clear message when it cannot load."""
    key = model_key()
    if not key:
        st.info("Type the path of a local Hugging Face model folder, or the id of a model in the local Hugging Face cache, in the sidebar.")
        st.stop()
    base, _ = pipeline.model.split_precision(key)  # an int8 model (key ":int8"): its fp32 model's folder
    if pipeline.model.builtin(base) is None:  # a local folder: checked before anything loads
        try:
            check_local(base)
        except ModelLoadError as e:
            _load_failed(e, "open this model")
            st.stop()
    lm = _wait_loaded(key, "the model")
    if lm is None:
        st.stop()
    _say_evictions(key)
    if st.session_state.get("_device_label") != lm.device_label:
        st.session_state["_device_label"] = lm.device_label
        st.sidebar.caption(f"**Device:** {lm.device_label}")
    return lm


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
        _load_failed(ModelLoadError(f"Could not load {what}: {ldr.error}"), f"load {what}")
        return None
    return ldr.result


def _load_failed(e: ModelLoadError, what: str) -> None:
    """A model that cannot be opened or loaded: its own message on one's own machine (it names the folder the
    user typed); on a demo server only a request id."""
    if guard.policy().enabled:
        fail(e, what, level="error")
    else:
        st.error(str(e))


def fp32_model(lm):
    """The fp32 model an int8 model was made from (its key without ":int8"), through the shared loaders (loaded once
    per process, with progress; never a download: the same weights the int8 model was quantised from). A demo server
    loads it only when its operator listed it too (a second model holds memory the operator budgeted for the listed
    ones). None, with a message, when it cannot load."""
    base, _ = pipeline.model.split_precision(lm.key)
    pol = guard.policy()
    if pol.enabled and base not in pol.models:
        st.info(
            "This demo server serves the int8 model only, so it does not load the fp32 one to compare with "
            "(page 12, Production mode, shows int8 beside fp32 on one prompt)."
        )
        return None
    return _wait_loaded(base, "its fp32 model")


def load_other_model(key: str):
    """Load a second model (e.g. a draft) with progress; a clear message and None when it cannot load."""
    pol = guard.policy()
    if pol.enabled and not pol.caps.draft_folders and key not in pol.models:
        st.warning("This demo server loads only the models its operator chose.")
        return None
    try:
        check_local(key)
    except ModelLoadError as e:
        st.error(str(e))
        return None
    return _wait_loaded(key, "the draft model")


def check_local(path: str) -> None:
    """A folder a visitor typed: refused unless it is under a models root (appstate.folder_refusal: the same answer
    whether or not the path exists), then checked as a model folder. Raises ModelLoadError."""
    why = appstate.folder_refusal(path)
    if why:
        raise ModelLoadError(why)
    pipeline.model.check_folder(path)


@st.cache_resource(show_spinner="Loading tokenizer…")
def tokenizer_for(key: str):
    return pipeline.model.load_tokenizer(key)


def remember(slot: str, value) -> None:
    """Keep a page's last result (a sweep, a comparison) for this session and the loaded model."""
    appstate.remember(st.session_state, slot, model_key(), value)


def recall(slot: str):
    """The page's last result for the loaded model, or None."""
    return appstate.recall(st.session_state, slot, model_key())


@dataclass(frozen=True)
class Ask:
    """One experiment a page runs: what it is, and everything its result depends on (token ids, candidates, the
    components, a mode). A page keeps the last result of each kind with it (per visitor and loaded model)."""

    what: str
    inputs: tuple


def kept(ask: Ask):
    """The result of `ask` if it is the last of its kind this visitor ran on the loaded model, else None."""
    got = recall(f"ask/{ask.what}")
    return got[1] if got is not None and got[0] == ask else None


def last(what: str):
    """(the ask, its result) of the last experiment of this kind on the loaded model, or None."""
    return recall(f"ask/{what}")


def run(ask: Ask, compute):
    """Compute `ask` now and keep it as the last of its kind."""
    value = compute()
    remember(f"ask/{ask.what}", (ask, value))
    return value


def cached(ask: Ask, compute):
    """`ask`'s kept result, or computed now and kept."""
    got = kept(ask)
    return got if got is not None else run(ask, compute)
