"""What a trace keeps and what it computes when read: the plan for a prompt of T tokens (every layer's queries, keys and
values; which layers' full maps are listed), its memory (estimated before a long prompt runs, and said), the attention
maps computed from the kept queries and keys the first time a page reads them (capture.MapSource: transformers' eager
attention's numbers), the all-layer overview with progress, and one layer's map pooled for drawing."""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.forward.activations import Activations, Later, Name, Site, View
from pipeline.model.capture import Capture, pool_attention
from pipeline.model.loaded import ModelFacts

ATTN_FULL_BUDGET = 256 << 20  # bytes of full-resolution float16 attention maps listed per trace (computed when read)
ATTN_OVERVIEW_MAX = 256  # the all-layers overview is pooled to at most this many positions


class MemoryTooSmall(ValueError):
    """A trace this long would not fit this machine's free memory (the message says the estimate)."""


LONG_T = 4096  # above this many tokens the kept queries, keys and values are float16 (memory: 470 MB at 8k, SmolLM2)


@dataclass
class Plan:
    """What one trace of T tokens keeps and shows: the attention overview's block, the layers whose [H, T, T] maps
    are listed at full resolution (computed when read, within ATTN_FULL_BUDGET), and the capture (every layer's
    queries, keys and values)."""

    block: int
    full_layers: set[int]
    capture: Capture


def capture_plan(f: ModelFacts, T: int, attn_layers: list[int] | None = None, qkv_layers: list[int] | None = None) -> Plan:
    """Every layer's Q/K/V kept; every layer's map at full resolution when they fit the memory budget, otherwise the
    pooled overview plus a few full layers (the asked-for ones first). Nothing here is computed before it is read."""
    del qkv_layers  # every layer's are kept now (the argument stays for callers that ask for one)
    L, H = f.n_layers, f.n_heads
    block = max(1, -(-T // ATTN_OVERVIEW_MAX))
    per_layer = H * T * T * 2
    if block == 1 and per_layer * L <= ATTN_FULL_BUDGET:
        full = set(range(L))
    else:
        wanted = list(dict.fromkeys([*(attn_layers or []), 0, L // 2, L - 1]))  # asked-for layers first
        full = set(wanted[: max(1, ATTN_FULL_BUDGET // per_layer)])
    return Plan(block, full, Capture(store=torch.float16 if T > LONG_T else torch.float32))


def trace_bytes(f: ModelFacts, T: int) -> int:
    """What a trace of T tokens holds before any map is read: the residual stream (L+1 x T x d, float32), every
    layer's Q/K/V, the last rows and the norms (the estimate said before a long prompt runs)."""
    per = 2 if T > LONG_T else 4
    qkv = f.n_layers * (f.n_heads + 2 * f.n_kv_heads) * T * f.head_dim * per
    return (f.n_layers + 1) * T * f.d_model * 4 + qkv + f.n_layers * f.n_heads * T * 4 + 4 * f.n_layers * T * 4


def check_memory(f: ModelFacts, T: int) -> None:
    """A trace this long must fit the memory this machine has free (with room for the forward's own): said, with the
    estimate, before anything runs."""
    import psutil

    need, free = trace_bytes(f, T), psutil.virtual_memory().available
    if need * 2 > free:
        raise MemoryTooSmall(
            f"A trace of {T:,} tokens keeps about {need / 2**20:,.0f} MB (the residual stream and every layer's queries, keys and values); "
            f"this machine has {free / 2**20:,.0f} MB free. Shorten the prompt."
        )


def lazy_maps(acts: Activations, cap: Capture, plan: Plan) -> None:
    """The attention maps, each computed from the kept queries and keys when first read (MapSource: the model's own
    eager attention, in blocks of rows): the pooled overview (all layers, or one), and the full-resolution layers."""
    src, block, L = cap.sources, plan.block, len(cap.sources)
    layer_memo: dict[int, np.ndarray] = {}
    lock = threading.Lock()

    def pooled_layer(i: int) -> np.ndarray:
        with lock:
            if i not in layer_memo:
                layer_memo[i] = src[i].pooled(block).numpy()
            return layer_memo[i]

    masks = {id(s.mask): s.mask for s in src.values() if s.mask is not None}
    acts.put(
        "blocks.*.attn.hook_pattern|pooled",
        Later(lambda: np.stack([pooled_layer(i) for i in range(L)]), layer=pooled_layer, source=masks, source_bytes=sum(m.nbytes for m in masks.values())),
    )
    if block > 1:  # with a block of 1 the pooled patterns are the full ones, every layer
        acts.put("blocks.*.attn.hook_pattern", {i: Later(lambda i=i: src[i].full().numpy()) for i in sorted(plan.full_layers)})


OVERVIEW = "blocks.*.attn.hook_pattern|pooled"


def overview(tr, progress=None) -> np.ndarray:
    """[L, H, T', T'] every layer's pooled attention, computed layer by layer the first time it is read (from the kept
    queries and keys, the model's own eager attention), with progress(fraction, message): ~25 s at 8k tokens here."""
    if not tr.acts.ready(OVERVIEW):
        L = tr.facts.n_layers
        for i in range(L):
            tr.acts[f"blocks.{i}.attn.hook_pattern|pooled"]
            if progress:
                progress((i + 1) / L, f"layer {i + 1} of {L}")
    return tr.acts[OVERVIEW]


def display_maps(tr, layer: int, max_n: int = 128) -> tuple[np.ndarray, int]:
    """One layer's attention for drawing: ([H, n, n] float32, block) with n <= max_n. Full resolution when the
    prompt is short enough, otherwise the stored overview pooled further (rows still sum to 1)."""
    full = tr.attention(layer)
    if full is not None and tr.T <= max_n:
        return full.astype(np.float32), 1
    src, block = tr.acts[Name(Site.PATTERN, layer, View.POOLED)], tr.acts.attn_block
    extra = max(1, -(-src.shape[-1] // max_n))
    if extra > 1:
        src = pool_attention(torch.from_numpy(src.astype(np.float32)), extra).numpy()
    return src.astype(np.float32), block * extra
