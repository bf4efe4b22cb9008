"""The per-row kernels between a layer's products, in pipeline/decode_step/cpu/cpu_decode.c (checked entry points): RMSNorm and
the SwiGLU gate, silu(g) * u. Each is one C call where numpy needed six operations (pipeline.decode_step.cpu.row_step asks
pipeline.decode_step.choice whether they serve, else computes the same formula in numpy)."""

from __future__ import annotations

import numpy as np

from pipeline.decode_step.cpu.library import F32, dim, library, need, ptr


def rms_norm(x: np.ndarray, scale: np.ndarray, eps: float) -> np.ndarray:
    """x [..., D] float32 (C-contiguous): each row / sqrt(mean(row^2) + eps) * scale [D] -> a new array."""
    need(x, "x", F32)
    D = dim(x.shape[-1] if x.ndim else 0, "x width")
    need(scale, "scale", F32, (D,))
    y = np.empty_like(x)
    if x.size:
        library().rms_norm(ptr(x), ptr(scale), ptr(y), dim(x.size // D, "x rows"), D, float(eps))
    return y


def silu_mul(gu: np.ndarray) -> np.ndarray:
    """gu = [g | u] [M, 2N] float32 (C-contiguous) -> silu(g) * u [M, N]."""
    need(gu, "gu", F32, (None, None))
    M, two = gu.shape
    if two % 2:
        raise ValueError(f"gu: an even width is needed (g and u side by side), not {two}")
    N = two // 2
    y = np.empty((M, N), dtype=np.float32)
    if gu.size:
        library().silu_mul(ptr(gu), ptr(gu) + 4 * N, ptr(y), dim(M, "gu rows"), dim(N, "gu width"), two)
    return y
