"""Decode attention over paged keys and values where they lie, in pipeline/decode_step/cpu/cpu_decode.c (`paged_attend`, a checked
entry point): each row attends over its own request's blocks, nothing gathered or padded (pipeline.decode_step.cpu.row_kv calls
it where pipeline.decode_step.choice says the C kernels serve)."""

from __future__ import annotations

import ctypes

import numpy as np

from pipeline.decode_step.cpu.library import F32, I32, dim, library, need, ptr


def paged_attend(q: np.ndarray, K: np.ndarray, V: np.ndarray, tables: np.ndarray, lo: np.ndarray, hi: np.ndarray, bs: int, scale, threads: int) -> np.ndarray:
    """Decode attention over paged keys and values where they lie (cpu_decode.c's `paged_attend`): q [B, KV, G, D]
    float32; K and V one layer's blocks [blocks, KV, bs, D] (or a static buffer [KV, max_len, D], one block of
    bs = max_len), the same shape and strides, each position's D values contiguous; tables [B, max_blocks] int32
    block numbers; row b attends to positions lo[b] <= p < hi[b] (int32 [B]). -> [B, KV * G * D]."""
    need(q, "q", F32, (None, None, None, None))
    B, KVh, G, D = (dim(n, f"q.shape[{i}]") for i, n in enumerate(q.shape))
    for name, a in (("K", K), ("V", V)):
        if not isinstance(a, np.ndarray) or a.dtype != F32 or a.ndim not in (3, 4):
            raise ValueError(f"{name}: a 3-D or 4-D float32 array is needed")
        if a.strides[-1] != 4 or any(s % 4 or s < 0 for s in a.strides):
            raise ValueError(f"{name}: each position's values must be contiguous float32 (strides {a.strides})")
    if K.shape != V.shape or K.strides != V.strides:
        raise ValueError(f"K, V: different shapes or strides ({K.shape} vs {V.shape})")
    blocks, kvs, slots, d = (1, *K.shape) if K.ndim == 3 else K.shape
    if kvs != KVh or d != D:
        raise ValueError(f"K: {kvs} KV heads of {d} values, q has {KVh} of {D}")
    if not 1 <= bs <= slots:
        raise ValueError(f"bs: {bs} positions a block, the buffer holds {slots}")
    need(tables, "tables", I32, (B, None))
    need(lo, "lo", I32, (B,))
    need(hi, "hi", I32, (B,))
    out = np.empty((B, KVh * G * D), dtype=np.float32)
    if B == 0 or KVh * G * D == 0:
        return out
    mb = dim(tables.shape[1], "tables columns")
    if mb == 0 or np.any(lo < 0) or np.any(hi <= lo) or np.any(hi > mb * bs):
        raise ValueError(f"lo, hi: every row needs 0 <= lo < hi <= {mb} blocks x {bs} positions")
    if tables.min() < 0 or tables.max() >= blocks:  # unused entries must be real blocks too (callers pad with 0)
        raise ValueError(f"tables: a block number outside 0..{blocks - 1}")
    if K.ndim == 3:  # a static buffer: one block of max_len positions
        s_blk, s_kv, s_pos = 0, K.strides[0] // 4, K.strides[1] // 4
    else:
        s_blk, s_kv, s_pos = K.strides[0] // 4, K.strides[1] // 4, K.strides[2] // 4
    failed = ctypes.c_int(0)
    library().paged_attend(
        ptr(q), ptr(K), ptr(V), s_blk, s_kv, s_pos, ptr(tables), mb, ptr(lo), ptr(hi), B, KVh, G, D, int(bs), float(scale), ptr(out),
        int(threads), ctypes.byref(failed),
    )  # fmt: skip
    if failed.value:
        raise MemoryError("paged_attend: no memory for the attention scores")
    return out
