"""Per-call capture of attention internals, safe with several callers sharing one model.

We register one attention implementation, "explorer", with transformers' AttentionInterface. Outside a
capture it simply runs PyTorch SDPA (the fast path). Inside `capturing(...)` - a context bound to the
calling thread - it runs the model's own eager attention function (so weights are exactly what
transformers' eager attention computes), keeps the weights as float16 and, for the layers asked for,
the query/key/value tensors after RoPE. The fp32 weights are dropped as soon as each layer finishes,
which is what lets a 2,048-token prompt trace in bounded memory. `as_traced()` runs the same eager attention and
keeps nothing: the forward passes that change a model (ablation, patching) compute what the trace computed, so
their "before" is the trace's own logits.
"""

from __future__ import annotations

import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, eager_mask

NAME = "explorer"
_local = threading.local()


@dataclass
class Capture:
    """What one traced forward pass leaves behind (filled layer by layer)."""

    full_layers: set[int]  # layers whose [H, T, T] maps are kept at full resolution
    block: int  # pooling block for the all-layers overview (1 = full)
    qkv_layers: set[int] = field(default_factory=set)
    full: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [H, T, T] float16
    pooled: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [H, T/b, T/b] float16
    last_row: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [H, T] float32
    qkv: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    keep: bool = True  # False: the trace's eager attention, nothing recorded (as_traced)


def pool_attention(w: torch.Tensor, block: int) -> torch.Tensor:
    """[H, T, T] -> [H, ceil(T/b), ceil(T/b)]: mean over the query rows, sum over the key columns of each
    block, so each pooled row still sums to 1 (a faithful, smaller picture of where attention goes)."""
    if block == 1:
        return w
    t = w.shape[-1]
    # avg_pool2d with ceil_mode divides edge windows by their in-bounds size; times the column count -> row sums
    avg = torch.nn.functional.avg_pool2d(w[None].float(), block, block, ceil_mode=True)[0]
    cols = torch.full((avg.shape[-1],), float(block))
    cols[-1] = t - block * (avg.shape[-1] - 1)
    return avg * cols


def _explorer_attention(module, query, key, value, attention_mask, **kwargs):
    cap: Capture | None = getattr(_local, "capture", None)
    if cap is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    eager = sys.modules[type(module).__module__].eager_attention_forward
    out, weights = eager(module, query, key, value, attention_mask, **kwargs)
    if not cap.keep:
        return out, None
    layer = module.layer_idx
    w = weights[0].detach()  # batch 1: [H, T, T]
    cap.last_row[layer] = w[:, -1, :].float().cpu().clone()  # clone: a view would keep all of w alive
    if layer in cap.full_layers:
        cap.full[layer] = w.to(torch.float16).cpu()
    if cap.block == 1 and layer in cap.full:
        cap.pooled[layer] = cap.full[layer]
    else:
        cap.pooled[layer] = pool_attention(w, cap.block).to(torch.float16).cpu()
    if layer in cap.qkv_layers:
        cap.qkv[layer] = {
            "q": query[0].detach().float().cpu().clone(),
            "k": key[0].detach().float().cpu().clone(),
            "v": value[0].detach().float().cpu().clone(),
        }
    return out, None


def _explorer_mask(*args, **kwargs):
    # The float additive mask of eager attention; SDPA accepts it too.
    return eager_mask(*args, **kwargs)


AttentionInterface.register(NAME, _explorer_attention)
ALL_MASK_ATTENTION_FUNCTIONS.register(NAME, _explorer_mask)


def install(model: torch.nn.Module) -> None:
    model.set_attn_implementation(NAME)


@contextmanager
def capturing(cap: Capture):
    """Bind `cap` to this thread for the duration of one forward pass."""
    _local.capture = cap
    try:
        yield cap
    finally:
        _local.capture = None


def as_traced():
    """The attention a trace runs (transformers' eager), recording nothing, for this thread's forward passes."""
    return capturing(Capture(full_layers=set(), block=1, keep=False))
