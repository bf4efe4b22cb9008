"""Per-call capture of attention internals, safe with several callers sharing one model.

We register one attention implementation, "explorer", with transformers' AttentionInterface. It always runs PyTorch
SDPA (the fast path), inside a capture too. Inside `capturing(...)` (a context bound to the calling thread) it keeps,
for every layer, the queries, keys and values after RoPE, the mask the layer attended with (one tensor per kind of
layer, shared; None where SDPA ran causally without one) and how to compute the layer's weights exactly as
transformers' eager attention would (the modeling file's own `eager_attention_forward`, the module's scaling, softcap,
sinks): a `MapSource`. The last query's row is computed during the pass (cheap: one row per head); every other map -
a layer's [H, T, T], a pooled overview - is computed from the kept queries and keys when something asks for it
(`MapSource.rows`, in blocks of query rows, so an 8k-token map never needs its fp32 [H, T, T] at once). A model with a
softcap (Gemma-2) has no SDPA kernel: there the layer's output runs eager. `as_traced()` keeps nothing: the forward
passes that change a model (ablation, patching) run what the trace ran, so their "before" is the trace's own logits.
"""

from __future__ import annotations

import sys
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

NAME = "explorer"
_local = threading.local()
ROWS_AT_ONCE = 1 << 24  # weights computed per block of query rows: H x rows x T at most this many (64 MB of fp32)


@dataclass(eq=False)
class MapSource:
    """One layer's attention weights, computable after the forward pass: its queries [H, T, D] and keys [Hkv, T, D]
    after RoPE, the mask it attended with ([T, T] bool, True = attended; None = causal), and the modeling file's
    eager attention with the module's own arguments (scaling, softcap, sinks), so the numbers are transformers' eager
    attention's. Holds the module weakly: a trace never keeps an unloaded model alive."""

    q: torch.Tensor
    k: torch.Tensor
    mask: torch.Tensor | None
    eager: object
    module: weakref.ref
    kwargs: dict

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """The weights of query rows start..stop-1: [H, stop - start, T] float32."""
        w = self._rows(start, stop)
        T = self.k.shape[-2]
        return w if w.shape[-1] == T else torch.nn.functional.pad(w, (0, T - w.shape[-1]))

    def _rows(self, start: int, stop: int) -> torch.Tensor:
        """The weights of query rows start..stop-1 over the keys up to the last one any of them attends ([H, rows, K],
        K <= T: past a decoder's causal edge every weight is 0, and computing them was half the work)."""
        module = self.module()
        if module is None:
            raise RuntimeError("the model this trace came from was unloaded: trace the prompt again to see this map")
        T = self.k.shape[-2]
        off = T - self.q.shape[-2]  # a decode step's queries come after the cached keys
        if self.mask is None:
            allowed = torch.ones(stop - start, stop + off, dtype=torch.bool).tril(start + off)
        else:
            allowed = self.mask[start:stop]
            cols = allowed.any(0).nonzero()
            allowed = allowed[:, : int(cols[-1]) + 1 if len(cols) else T]
        K = allowed.shape[-1]
        q = self.q[None, :, start:stop].float()
        k = self.k[None, :, :K].float()
        bias = torch.zeros(allowed.shape, dtype=torch.float32).masked_fill_(~allowed, torch.finfo(torch.float32).min)
        with torch.inference_mode():
            # values of width 1: the weights do not depend on them, and the weights-times-values product is then nothing
            _, w = self.eager(module, q, k, k[..., :1], bias[None, None], **self.kwargs)
        return w[0].float()

    def blocks(self, step: int | None = None):
        """(start, stop, weights over the first K keys) over every query row, in blocks of at most ROWS_AT_ONCE weights."""
        H, T = self.q.shape[0], self.q.shape[-2]
        step = step or max(1, ROWS_AT_ONCE // max(1, H * T))
        for a in range(0, T, step):
            yield a, min(T, a + step), self._rows(a, min(T, a + step))

    def full(self) -> torch.Tensor:
        """[H, T, T] float16: every row."""
        H, T = self.q.shape[0], self.q.shape[-2]
        out = torch.zeros(H, T, T, dtype=torch.float16)
        for a, b, w in self.blocks():
            out[:, a:b, : w.shape[-1]] = w.to(torch.float16)
        return out

    def pooled(self, block: int) -> torch.Tensor:
        """[H, T', T'] float16 (T' = ceil(T / block)): mean over each block's query rows, sum over its key columns."""
        if block == 1:
            return self.full()
        H, T = self.q.shape[0], self.q.shape[-2]
        n = -(-T // block)
        out = torch.zeros(H, n, n, dtype=torch.float32)
        step = max(block, (max(1, ROWS_AT_ONCE // max(1, H * T)) // block) * block)  # whole blocks of rows at once
        for a, b, w in self.blocks(step):
            p = pool_attention(w, block)  # the keys past w's last are all 0: their blocks' sums are 0
            out[:, a // block : -(-b // block), : p.shape[-1]] = p
        return out.to(torch.float16)

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.k.nbytes


@dataclass
class Capture:
    """What one traced forward pass leaves behind (filled layer by layer)."""

    store: torch.dtype = torch.float32  # the kept queries, keys and values (float16 for long prompts: memory)
    sources: dict[int, MapSource] = field(default_factory=dict)
    last_row: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [H, T] float32
    v: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [Hkv, T, D]
    keep: bool = True  # False: nothing recorded (as_traced)
    last_only: bool = False  # True: the last query's rows only, nothing copied (a decode step's recording)


def pool_attention(w: torch.Tensor, block: int, n_keys: int | None = None) -> torch.Tensor:
    """[H, R, T] -> [H, ceil(R/b), ceil(T/b)]: mean over the query rows, sum over the key columns of each
    block, so each pooled row still sums to 1 (a faithful, smaller picture of where attention goes). The rows are
    whole blocks but the last."""
    if block == 1:
        return w
    t = w.shape[-1] if n_keys is None else n_keys
    # avg_pool2d with ceil_mode divides edge windows by their in-bounds size; times the column count -> row sums
    avg = torch.nn.functional.avg_pool2d(w[None].float(), block, block, ceil_mode=True)[0]
    cols = torch.full((avg.shape[-1],), float(block))
    cols[-1] = t - block * (avg.shape[-1] - 1)
    return avg * cols


def _eager_of(module):
    return sys.modules[type(module).__module__].eager_attention_forward


def _explorer_attention(module, query, key, value, attention_mask, **kwargs):
    cap: Capture | None = getattr(_local, "capture", None)
    if kwargs.get("softcap") is not None:  # no SDPA kernel softcaps: the model's eager attention (Gemma-2)
        out, _ = _eager_of(module)(module, query, key, value, attention_mask, **kwargs)
    else:
        out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if cap is None or not cap.keep:
        return out, None
    layer = module.layer_idx
    mask = None
    if attention_mask is not None:
        m = attention_mask[0, 0]
        mask = m if m.dtype == torch.bool else m == 0  # an additive float mask: 0 where attended
    args = {k: v for k, v in kwargs.items() if isinstance(v, (int, float, bool, type(None))) or k == "s_aux"}
    args["dropout"] = 0.0
    if cap.last_only:  # the live tensors, read once here: copying the whole cache every step would be O(steps^2)
        src = MapSource(query[0].detach(), key[0].detach(), None if mask is None else mask, _eager_of(module), weakref.ref(module), args)
        cap.last_row[layer] = src.rows(query.shape[-2] - 1, query.shape[-2])[:, 0].float().cpu().clone()
        return out, None
    src = MapSource(_kept(query, cap.store), _kept(key, cap.store), None if mask is None else mask.detach().cpu(), _eager_of(module), weakref.ref(module), args)
    cap.sources[layer] = src
    cap.v[layer] = _kept(value, cap.store)
    T = query.shape[-2]
    cap.last_row[layer] = src.rows(T - 1, T)[:, 0].clone()
    return out, None


def _kept(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x[0] as the trace keeps it: on the CPU in `dtype`, copied once (a conversion is already a copy)."""
    y = x[0].detach().to("cpu", dtype)
    return y.clone() if y.data_ptr() == x.data_ptr() else y


def _explorer_mask(*args, **kwargs):
    # SDPA's mask (None where it can run causally): the maps are computed from the kept mask, as eager would
    return sdpa_mask(*args, **kwargs)


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
    """The attention a trace runs (SDPA), recording nothing, for this thread's forward passes."""
    return capturing(Capture(keep=False))
