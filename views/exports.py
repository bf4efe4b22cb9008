"""What a page's figures and tables carry into exports and slides: the registry of what this run of the page drew
(PageExports: the page's ZIP), and the note inside every exported image (context_note: the model, the prompt, the
view's settings by their slide names). views.render draws; this module remembers and names."""

from __future__ import annotations

import streamlit as st

import pipeline
from components import export
from views import guard, st_private
from views.loading import model_key


class PageExports:
    """What the page drew in this run, for "Export this page": figures (with the note that goes inside their
    image), tables, images and non-Plotly views."""

    def __init__(self, title: str):
        self.title, self.figures, self.tables, self.html, self.images = title, [], {}, {}, {}
        # who asks, read now: the ZIP is made later, when the button is clicked, outside this page run
        self._who = (guard.session_key(), guard.client_address())
        self._stem = export.slug(self.title, (st.session_state.get("prompt") or "")[:40])

    def stem(self) -> str:
        return self._stem

    def zip(self) -> bytes:
        """The page's ZIP, made on the click. On a demo server it counts as a run (the browser's and the address's
        limits); a refused export is a ZIP holding only REFUSED.txt, which says why and when to try again. Its
        images are drawn one at a time through the one image exporter, so another visitor's export runs between
        this one's figures instead of waiting for all of them."""
        why = guard.refusal(*self._who, "the export")
        if why:
            return export.refused_zip(self._stem, why)
        return export.page_zip(self._stem, self.figures, self.tables, self.html, images=self.images)


# query parameters that are not a view's settings: the prompt and model are named on their own, the rest is plumbing
NOT_SETTINGS = ("prompt", "model_choice", "present", "p", "view", "s", "chat")
_LABELS: dict[str, str] = {}  # model key -> its label (a folder's label never changes)


def context_note(settings: dict | None = None) -> str:
    """What shaped this page's figures, for the line inside every exported image: the model, the prompt
    (shortened), chat mode and the view's settings (its widgets bound to the link, and the page's own)."""
    key = model_key()
    if key not in _LABELS:
        _LABELS.update({m.key: m.label for m in pipeline.available_models(int8=True)})
    model = _LABELS.get(key, key)
    prompt = " ".join((st.session_state.get("prompt") or "").split())
    prompt = prompt if len(prompt) <= 60 else prompt[:57] + "…"
    parts = [model, f"prompt “{prompt}”" + (" (chat template)" if st.session_state.get("chat") else "")]
    # only the view's own settings, at their defaults too (a slide says temperature 1.0 even when the link does not):
    # a parameter that no widget of this page is bound to (a typo, or text someone put in a link: "?zz=Visit
    # evil.example") never reaches an image
    view = {setting_name(k): _shown(st.session_state[k]) for k in page_settings() if k not in NOT_SETTINGS and k in st.session_state}
    view |= {k: v for k, v in (settings or {}).items() if v is not None}
    if view:
        parts.append(", ".join(f"{k.replace('_', ' ')} {v}" for k, v in view.items()))
    return " · ".join(parts)


SETTING_NAMES = {  # a bound widget's key -> what a slide calls it (a key not here: its words, the page's prefix dropped)
    "t": "temperature",
    "k": "top-k",
    "p": "top-p",
    "minp": "min-p",
    "top_k": "top-k",
    "top_p": "top-p",
    "min_p": "min-p",
    "n": "max new tokens",
    "n_show": "candidates shown",
    "attn_scale": "colour scale",
    "attn_sink": "first token hidden",
    "attn_present_head": "head on screen",
    "bv_layers": "bertviz layers",
    "bv_view": "bertviz view",
    "roof_T": "prompt tokens",
    "roof_C": "context tokens",
    "shard_n": "devices",
    "spec_gamma": "draft tokens per call (γ)",
    "spec_kind": "draft model",
    "spec_own": "draft folder",
    "spec_prompt": "prompt",
    "myth_at": "forced at token",
    "batch_eos": "stop at end-of-sequence",
    "batch_lib": "transformers' batch too",
    "emb_refs": "reference words",
    "emb_dims": "dimensions",
    "layer_pos": "position",
    "steps_new": "decode steps",
    "steps_on": "steps recorded",
    "steps_step": "decode step",
}


def setting_name(key: str) -> str:
    """A bound widget's name on a slide: "gen_t" -> "temperature", "attn_head" -> "head"."""
    if key in SETTING_NAMES:
        return SETTING_NAMES[key]
    rest = key.split("_", 1)[1] if "_" in key else key
    return SETTING_NAMES.get(rest, rest.replace("_", " "))


def _shown(v) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:g}"
    if isinstance(v, (list, tuple)):
        return ", ".join(map(str, v))
    return str(v)


def page_settings() -> list[str]:
    """The keys of the widgets this page binds to the link (drawn so far in this run's page script), whatever their
    values: Streamlit's binding registry, filtered to the page's own script (the sidebar's are named apart). Where
    that registry cannot be read (another Streamlit), the settings in the address."""
    bound = st_private.page_bindings()  # a private registry (views/st_private.py): else what the address shows
    return bound if bound is not None else list(st.query_params)


def current() -> PageExports:
    """What this run of the page drew so far (the header made the registry; a page run without it: a fresh one)."""
    return st.session_state.get("_exports") or PageExports("page")
