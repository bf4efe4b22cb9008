"""One forward pass, in the order a prompt meets it: tokens (pieces, ids, special tokens, the chat template), the
hooked trace of every layer (tracing; what it keeps and computes when read: kept) with its activations under one name each (activations), the readouts computed
from it (analysis), why this token (attribution), and the next-token distribution with temperature, top-k, top-p and
min-p (sampling). The face: what the app's side uses of them (tests/app/test_faces.py)."""

from pipeline.forward import analysis, kept, sampling, tracing
from pipeline.forward.activations import Component, Kind, Name, Site, View
from pipeline.forward.attribution import FLOW_MAX_TOKENS, Ablation, PatchOver, UnknownNorm, ablate, attribute, flow, patch
from pipeline.forward.kept import LONG_T, OVERVIEW, display_maps, overview
from pipeline.forward.tokens import text_of
from pipeline.forward.tracing import LENS_GRID_MAX, TraceError, check_prompt, forward_repeats, lens_grid, over_cap

__all__ = [
    "FLOW_MAX_TOKENS",
    "LENS_GRID_MAX",
    "LONG_T",
    "OVERVIEW",
    "Ablation",
    "UnknownNorm",
    "Component",
    "Kind",
    "Name",
    "PatchOver",
    "Site",
    "TraceError",
    "View",
    "ablate",
    "analysis",
    "attribute",
    "check_prompt",
    "display_maps",
    "flow",
    "forward_repeats",
    "kept",
    "lens_grid",
    "over_cap",
    "overview",
    "patch",
    "sampling",
    "text_of",
    "tracing",
]
