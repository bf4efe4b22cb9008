"""A Llama-family decoder layer in one call of pipeline/decode_step/cpu/cpu_decode.c (`row_layer`), through checked arguments as
every kernel (pipeline.decode_step.cpu.library's checks): the layer's weights checked once (LayerWeights), a pass's rows and their KV
slots checked once for all its layers (LayerRows), then one call a layer (row_layer), or one call for every layer
(LayerStack, row_layers: a pass nothing interrupts between layers). pipeline.decode_step.cpu.row_step uses it where the layer fits
(_RowLayer.whole)."""

from __future__ import annotations

import ctypes
from typing import NamedTuple

import numpy as np
import torch

from pipeline.decode_step.cpu.library import F32, I32, dim, library, need, ptr
from pipeline.decode_step.cpu.matmul import panel


def _scales(w: torch.Tensor, scale, name: str) -> np.ndarray | None:
    """An int8 weight's per-row scales as a checked float32 array [N] (None for a float32 weight, which has none)."""
    dtype = torch.float32 if scale is None else torch.int8
    if not isinstance(w, torch.Tensor) or w.dtype != dtype or w.dim() != 2:
        raise ValueError(f"{name}: a 2-D {dtype} tensor is needed, not {getattr(w, 'dtype', type(w).__name__)} {tuple(getattr(w, 'shape', ()))}")
    if scale is None:
        return None
    sc = np.ascontiguousarray(scale.detach().numpy() if isinstance(scale, torch.Tensor) else scale, dtype=F32)
    need(sc, f"{name} scales", F32, (w.shape[0],))
    return sc


class LayerWeights:
    """One Llama-family layer's weights for cpu_decode.c's `row_layer`, checked once: the four products' panels
    (and biases), the two norms' scales and epsilons, the shapes. With `scales` (four [N] arrays, one fp32 scale per
    output row), the four weights are int8 (weight-only, pipeline.model.quantised) and their panels int8, widened to
    fp32 in registers and scaled per row by the same kernels."""

    def __init__(self, wqkv, bqkv, wo, bo, wgu, bgu, wdown, bdown, n_in, eps_in, n_mid, eps_mid, H, KV, D, scales=None):
        d, inner = wo.shape[0], wdown.shape[1]
        want = {"wqkv": (wqkv, ((H + 2 * KV) * D, d)), "wo": (wo, (d, H * D)), "wgu": (wgu, (2 * inner, d)), "wdown": (wdown, (d, inner))}
        self.scales = [_scales(w, None if scales is None else scales[k], name) for k, (name, (w, _)) in enumerate(want.items())]
        for name, (w, shape) in want.items():
            if tuple(w.shape) != shape:
                raise ValueError(f"{name}: a tensor {shape} is needed, not {tuple(w.shape)}")
        if H % KV or D % 2:
            raise ValueError(f"heads: {H} query heads over {KV} KV heads of {D} values")
        self.H, self.KV, self.D, self.d, self.I = (dim(n, "a layer dimension") for n in (H, KV, D, d, inner))
        self.panels = [panel(w) for w in (wqkv, wo, wgu, wdown)]
        self.biases = []
        for b, n in ((bqkv, wqkv.shape[0]), (bo, d), (bgu, 2 * inner), (bdown, d)):
            if b is not None:
                b = np.ascontiguousarray(b.detach().numpy())
                need(b, "bias", F32, (n,))
            self.biases.append(b)
        for name, n in (("n_in", n_in), ("n_mid", n_mid)):
            need(n, name, F32, (d,))
        self.norms = (n_in, float(eps_in), n_mid, float(eps_mid))
        self.ws = d + (H + 2 * KV) * D + H * D + 3 * inner + d  # floats of workspace per row


class LayerRows:
    """The rows of one pass for `row_layer`, checked once for all its layers: each row's KV slot (block `blk`,
    offset `off`) and block table, the positions it attends to end at `hi` (its own, included). K, V: every layer's
    KV memory [L, blocks, KV, bs, D] (the engine's blocks) or [L, KV, max_len, D] (one request's buffers, one block)."""

    def __init__(self, K: np.ndarray, V: np.ndarray, blk, off, tables: np.ndarray, hi, bs: int):
        for name, a in (("K", K), ("V", V)):
            if not isinstance(a, np.ndarray) or a.dtype != F32 or a.ndim not in (4, 5) or not a.flags.c_contiguous:
                raise ValueError(f"{name}: a C-contiguous 4-D or 5-D float32 array is needed")
        if K.shape != V.shape:
            raise ValueError(f"K, V: different shapes ({K.shape} vs {V.shape})")
        self.K, self.V = K, V
        self.blocks, self.KV, slots, self.D = (1, *K.shape[1:]) if K.ndim == 4 else K.shape[1:]
        st = [s // 4 for s in K.strides]
        self.strides = (0, st[1], st[2]) if K.ndim == 4 else (st[1], st[2], st[3])  # a block, a KV head, a position
        self.layer_bytes = K.strides[0]
        self.blk, self.off, self.hi = (np.ascontiguousarray(v, dtype=I32) for v in (blk, off, hi))
        self.tables = np.ascontiguousarray(tables, dtype=I32)
        M = self.M = dim(len(self.hi), "rows")
        need(self.tables, "tables", I32, (M, None))
        self.mb = dim(self.tables.shape[1], "tables columns")
        if not 1 <= bs <= slots:
            raise ValueError(f"bs: {bs} positions a block, the buffer holds {slots}")
        self.bs = int(bs)
        if M and (
            len(self.blk) != M
            or len(self.off) != M
            or self.mb == 0
            or self.tables.min() < 0
            or self.tables.max() >= self.blocks
            or self.blk.min() < 0
            or self.blk.max() >= self.blocks
            or self.off.min() < 0
            or self.off.max() >= self.bs
            or self.hi.min() < 1
            or self.hi.max() > self.mb * self.bs
        ):
            raise ValueError("rows: a block, offset or position outside the KV memory")
        self._lo: dict = {}

    def lo(self, window: int | None) -> np.ndarray:
        """Where each row's attention starts: 0, or its sliding window's first position."""
        lo = self._lo.get(window)
        if lo is None:
            from pipeline.decode_step.kv_layout import window_start

            lo = self._lo[window] = np.ascontiguousarray(window_start(self.hi, window), dtype=I32)
        return lo


class LayerStack:
    """Layers 0 .. L-1 (LayerWeights of one model) for cpu_decode.c's `row_layers`: their pointers as C arrays, built
    once; every layer the same shape (checked)."""

    def __init__(self, layers: list[LayerWeights]):
        if not layers:
            raise ValueError("layers: none given")
        first = layers[0]
        if any((w.H, w.KV, w.D, w.d, w.I) != (first.H, first.KV, first.D, first.d, first.I) for w in layers):
            raise ValueError("layers: not all of one shape")
        self.layers, self.L = layers, len(layers)  # held: the arrays below point into their memory
        P, F = ctypes.c_void_p * self.L, ctypes.c_float * self.L
        self.norms = (
            P(*(ptr(w.norms[0]) for w in layers)),
            F(*(w.norms[1] for w in layers)),
            P(*(ptr(w.norms[2]) for w in layers)),
            F(*(w.norms[3] for w in layers)),
        )
        self.products = [P(*(ptr(w.panels[k]) for w in layers)) for k in range(4)]
        self.biases = [P(*(None if w.biases[k] is None else ptr(w.biases[k]) for w in layers)) for k in range(4)]
        if any((w.scales[0] is None) != (first.scales[0] is None) for w in layers):
            raise ValueError("layers: not all of one precision")
        # the int8 products' scales as arrays of L pointers (None: fp32 panels)
        self.scales = [None if first.scales[k] is None else P(*(ptr(w.scales[k]) for w in layers)) for k in range(4)]


class Head:
    """The final norm and the LM head for `row_layers`, checked once: the norm's scale [d] and epsilon, the head's
    panels (and bias) of vocab x d; int8 panels with `rows` (one fp32 scale per output row) where w is int8."""

    def __init__(self, scale: np.ndarray, eps: float, w: torch.Tensor, b: torch.Tensor | None, rows=None):
        self.rows = _scales(w, rows, "head")
        self.vocab, self.d = (dim(n, "a head dimension") for n in w.shape)
        need(scale, "final norm", F32, (self.d,))
        self.scale, self.eps, self.panels = scale, float(eps), panel(w)
        self.bias = None if b is None else np.ascontiguousarray(b.detach().numpy())
        if self.bias is not None:
            need(self.bias, "head bias", F32, (self.vocab,))


def _head_rows(head: Head | None) -> int | None:
    """The head's int8 scales' address for the C call (None: fp32 panels, or no head)."""
    return None if head is None or head.rows is None else ptr(head.rows)


def _checked(x, w: LayerWeights, rows: LayerRows, cos, sin, ws, layers: int, what: str) -> np.ndarray | None:
    """What a layer's call and a stack's share: x [M, d], cos and sin [M, D], a KV memory holding `layers` layers of
    the weights' heads, a workspace of M * w.ws floats (a new one where ws is None). None when there are no rows."""
    M = rows.M
    need(x, "x", F32, (M, w.d))
    for name, t in (("cos", cos), ("sin", sin)):
        need(t, name, F32, (M, w.D))
    if (rows.KV, rows.D) != (w.KV, w.D) or layers < 1 or layers * rows.layer_bytes > rows.K.nbytes:
        raise ValueError(f"rows: {what} with {rows.KV} KV heads of {rows.D}, the layers have {w.KV} of {w.D}")
    if M == 0:
        return None
    if ws is None:
        ws = np.empty(M * w.ws, dtype=np.float32)
    need(ws, "ws", F32, (None,))
    if ws.size < M * w.ws:
        raise ValueError(f"ws: {M * w.ws} floats needed, {ws.size} given")
    return ws


def row_layers(
    x: np.ndarray,
    stack: LayerStack,
    rows: LayerRows,
    cos: np.ndarray,
    sin: np.ndarray,
    scale,
    ws: np.ndarray | None = None,
    head: Head | None = None,
    keep=None,
) -> np.ndarray | None:
    """Every layer of `stack` for the rows x [M, d] (updated in place) in one call of cpu_decode.c's `row_layers`: the
    same numbers as row_layer for layers 0, 1, ... (the same kernels, in the same order), with no sliding window.
    `rows`' KV memory holds the stack's layers. With `head`: then, in the same call, the rows `keep` (default all)
    through the final norm and the LM head, returned as logits [len(keep), vocab] (the same numbers as panel_linear's)."""
    w, M = stack.layers[0], rows.M
    ws = _checked(x, w, rows, cos, sin, ws, stack.L, f"{stack.L} layers")
    if ws is None:
        return None
    tail: tuple = (None, 0.0, None, None, 0, None, 0, None)
    logits = None
    if head is not None:
        if head.d != w.d:
            raise ValueError(f"head: {head.d} inputs, the layers give {w.d}")
        kept = np.ascontiguousarray(np.arange(M) if keep is None else keep, dtype=I32)
        if kept.ndim != 1 or (len(kept) and (kept.min() < 0 or kept.max() >= M)):
            raise ValueError(f"keep: rows of 0..{M - 1} are needed")
        logits = np.empty((len(kept), head.vocab), dtype=np.float32)
        if len(kept):
            b = None if head.bias is None else ptr(head.bias)
            tail = (ptr(head.scale), head.eps, ptr(head.panels), b, head.vocab, ptr(kept), len(kept), ptr(logits))
    lo, failed = rows.lo(None), ctypes.c_int(0)
    (pq, po, pg, pd), (bq, bo, bg, bd) = stack.products, stack.biases
    library().row_layers(
        stack.L, ptr(x), M, w.d, w.H, w.KV, w.D, w.I, *stack.norms, pq, bq, po, bo, pg, bg, pd, bd, ptr(cos), ptr(sin),
        ptr(rows.K), ptr(rows.V), rows.layer_bytes // 4, *rows.strides, ptr(rows.blk), ptr(rows.off), ptr(rows.tables),
        rows.mb, ptr(lo), ptr(rows.hi), rows.bs, float(scale), ptr(ws), torch.get_num_threads(), ctypes.byref(failed), *tail,
        *stack.scales, _head_rows(head),
    )  # fmt: skip
    if failed.value:
        raise MemoryError("row_layers: no memory for the attention scores")
    return logits


def row_layer(
    i: int, x: np.ndarray, w: LayerWeights, rows: LayerRows, cos: np.ndarray, sin: np.ndarray, window: int | None, scale, ws: np.ndarray | None = None
) -> None:
    """Layer `i` of a Llama-family model for the rows x [M, d] (updated in place), through cpu_decode.c's
    `row_layer`: norms, products, RoPE (cos, sin [M, D]: each row's position), the K/V write into `rows`' memory,
    attention, SiLU MLP, both residual adds, in one call. `ws`: workspace of at least M * w.ws floats, reused by a
    pass's layers (else a new one)."""
    M = rows.M
    ws = _checked(x, w, rows, cos, sin, ws, i + 1, f"layer {i}")
    if ws is None:
        return
    lo, failed, off = rows.lo(window), ctypes.c_int(0), i * rows.layer_bytes
    n_in, eps_in, n_mid, eps_mid = w.norms
    (pq, po, pg, pd), (bq, bo, bg, bd) = w.panels, [None if b is None else ptr(b) for b in w.biases]
    library().row_layer(
        ptr(x), M, w.d, w.H, w.KV, w.D, w.I, ptr(n_in), eps_in, ptr(n_mid), eps_mid,
        ptr(pq), bq, ptr(po), bo, ptr(pg), bg, ptr(pd), bd, ptr(cos), ptr(sin),
        ptr(rows.K) + off, ptr(rows.V) + off, *rows.strides, ptr(rows.blk), ptr(rows.off), ptr(rows.tables), rows.mb,
        ptr(lo), ptr(rows.hi), rows.bs, float(scale), ptr(ws), torch.get_num_threads(), ctypes.byref(failed),
        *(None if sc is None else ptr(sc) for sc in w.scales),
    )  # fmt: skip
    if failed.value:
        raise MemoryError("row_layer: no memory for the attention scores")


class Steps(NamedTuple):
    """What row_steps made: `n` steps (each row one token a step), and each step's greedy summary of every row:
    argmax [n, M] (the tokens), lse [n, M], vals and ids [n, M, k] (the k largest logits, largest first)."""

    n: int
    argmax: np.ndarray
    lse: np.ndarray
    vals: np.ndarray
    ids: np.ndarray


def _checked_steps(w: LayerWeights, head: Head, rows: LayerRows, table, cos_all, sin_all, tokens, positions, room, stop, left, steps: int, k: int):
    """row_steps' arguments checked (a ValueError naming what is wrong): (tokens int64, positions and lefts int32,
    stop int32 C-contiguous, the steps the call may do at most)."""
    M = rows.M
    if not 1 <= steps or not 1 <= k <= head.vocab or head.d != w.d:
        raise ValueError(f"row_steps: steps {steps} and k {k} of {head.vocab} (head of {head.d} inputs, layers of {w.d})")
    tok = np.array(tokens, dtype=np.int64)
    pos, room, left = (np.array(a, dtype=I32) for a in (positions, room, left))
    if not (len(tok) == len(pos) == len(room) == len(left) == M) or M == 0:
        raise ValueError(f"row_steps: {M} rows of KV memory, {len(tok)} tokens, {len(pos)} positions, {len(room)} rooms, {len(left)} lefts")
    need(table, "table", F32, (None, w.d))
    for name, t in (("cos_all", cos_all), ("sin_all", sin_all)):
        need(t, name, F32, (None, w.D))
    stop = np.ascontiguousarray(stop, dtype=I32)
    need(stop, "stop", I32, (M, None))
    n = min(steps, int(left.min()))  # no row makes more than it may: the call does at most n steps
    if left.min() < 1 or tok.min() < 0 or tok.max() >= table.shape[0] or pos.min() < 0:
        raise ValueError("row_steps: a row with no tokens left, a token outside the embedding, or a negative position")
    if (pos + n > np.minimum(room, rows.mb * rows.bs)).any() or pos.max() + n > min(len(cos_all), len(sin_all)):
        raise ValueError("row_steps: the steps would pass a row's KV blocks or the RoPE tables")
    return tok, pos, left, stop, n


def row_steps(
    stack: LayerStack,
    head: Head,
    rows: LayerRows,
    table: np.ndarray,
    cos_all: np.ndarray,
    sin_all: np.ndarray,
    tokens,
    positions,
    room,
    stop: np.ndarray,
    left,
    flag: ctypes.c_int,
    steps: int,
    scale,
    k: int,
) -> Steps:
    """Up to `steps` greedy decode tokens for M rows in one call of cpu_decode.c's `row_steps`: each step the rows'
    tokens (tokens [M] first, then each row's argmax) at positions [M] (then + 1 each step) through every layer of
    `stack` and `head`, the same numbers as a row_layers pass of its own per step. `rows` gives the KV memory and
    each row's block table (its blk/off/hi are not read); room [M]: the positions each row's blocks hold (a step
    past them is refused here); table [vocab_in, d]: the embedding; cos_all, sin_all [positions, D]: RoPE; stop
    [M, S] int32 (-1: none): a row's stop ids; left [M]: tokens each row may still make; flag: stops the call after
    the current step when set (by another thread). The call ends after the step where a row stopped or ran out, or
    where the flag was set."""
    w, M = stack.layers[0], rows.M
    tok, pos, left, stop, n = _checked_steps(w, head, rows, table, cos_all, sin_all, tokens, positions, room, stop, left, steps, k)
    S = stop.shape[1]
    out = Steps(n, np.empty((n, M), np.int64), np.empty((n, M), np.float32), np.empty((n, M, k), np.float32), np.empty((n, M, k), np.int64))
    x, cs, logits = np.empty((M, w.d), np.float32), np.empty((2, M, w.D), np.float32), np.empty((M, head.vocab), np.float32)
    blk, off, hi, lo = (np.zeros(M, dtype=I32) for _ in range(4))
    keep = np.arange(M, dtype=I32)
    ws, failed = np.empty(M * w.ws, dtype=np.float32), ctypes.c_int(0)
    (pq, po, pg, pd), (bq, bo, bg, bd) = stack.products, stack.biases
    b = None if head.bias is None else ptr(head.bias)
    done = library().row_steps(
        n, ptr(table), ptr(cos_all), ptr(sin_all), ptr(tok), ptr(pos), ptr(stop) if S else None, S, ptr(left),
        ctypes.addressof(flag), k, *(ptr(a) for a in out[1:]), ptr(cs), ptr(blk), ptr(off), ptr(hi),
        stack.L, ptr(x), M, w.d, w.H, w.KV, w.D, w.I, *stack.norms, pq, bq, po, bo, pg, bg, pd, bd,
        ptr(rows.K), ptr(rows.V), rows.layer_bytes // 4, *rows.strides, ptr(rows.tables), rows.mb, ptr(lo), rows.bs,
        float(scale), ptr(ws), torch.get_num_threads(), ctypes.byref(failed),
        ptr(head.scale), head.eps, ptr(head.panels), b, head.vocab, ptr(keep), ptr(logits), *stack.scales, _head_rows(head),
    )  # fmt: skip
    if failed.value:
        raise MemoryError("row_steps: no memory for the attention scores")
    return Steps(done, *(a[:done] for a in out[1:]))
