"""Matrix products on a CPU, each through the kernel pipeline.decode_step.choice says reads its weight fastest.

    y = linear(x, w, b)                 # F.linear(x, w, b), by the kernel CHOICE.linear(x, w) names
    y = panel_rows(x, w, b)             # x (numpy) @ w.T through pipeline/decode_step/cpu/cpu_decode.c, any number of rows
    p = packed_panels(w); panel_product(x, p, N, K, b, scale)   # any panels: fp32, bf16 bits, int8 with scales

The kernels: pipeline/decode_step/cpu/cpu_decode.c's panel product over a copy of the weight in its panel layout (made once, kept
on the weight), OpenBLAS's matrix-vector product for one row (numpy views, nothing copied; also an operator
torch.compile calls as it is), oneDNN over the weight packed once in its blocked layout, MKL as W @ xᵀ, and F.linear.
Why each, measured: pipeline.decode_step.choice.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.decode_step.choice import CHOICE, ONEDNN_KERNEL, PANEL, SGEMV, TALL
from pipeline.decode_step.cpu.huge_pages import aligned
from pipeline.decode_step.cpu.library import F32, I8, U16, dim, library, lock, need, ptr

PACK_HINT = 16  # the batch size oneDNN lays the weight out for (8-32 rows within 5% of their own hint)
_PACKED = "_onednn_packed"  # the attribute under which a weight keeps its oneDNN copy
_PANEL = "_panel_packed"  # ... and its panel copy
_PACKERS = {F32: "pack", I8: "pack_i8", U16: "pack_u16"}


def packed(w: torch.Tensor) -> torch.Tensor:
    """w re-laid for oneDNN, made once and kept on the weight itself (freed with it)."""
    p = getattr(w, _PACKED, None)
    if p is None:
        p = torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_HINT)
        setattr(w, _PACKED, p)
    return p


def panel_size(N: int, K: int) -> int:
    """Elements of the panel copy of an [N, K] weight: ceil(N / 16) panels of K x 16."""
    return -(-N // 16) * 16 * K


def packed_panels(w: np.ndarray) -> np.ndarray:
    """A C-contiguous [N, K] array of float32, int8 or uint16 (bf16 bits) copied into the kernel's panels."""
    if not isinstance(w, np.ndarray) or w.ndim != 2 or w.dtype not in _PACKERS:
        raise ValueError(f"w: a 2-D float32, int8 or uint16 array is needed, not {getattr(w, 'dtype', type(w).__name__)} {getattr(w, 'shape', '')}")
    N, K = dim(w.shape[0], "w rows"), dim(w.shape[1], "w columns")
    p = aligned(panel_size(N, K), w.dtype)
    src = np.ascontiguousarray(w)  # held in a name: a temporary's memory could be freed before the call reads it
    getattr(library(), _PACKERS[w.dtype])(ptr(src), ptr(p), N, K)
    return p


def panel_product(x: np.ndarray, p: np.ndarray, N: int, K: int, b: np.ndarray | None = None, scale: np.ndarray | None = None) -> np.ndarray:
    """x [M, K] float32 @ W.T (+ b) -> a new [M, N] float32, W [N, K] given as its panels `p` (packed_panels):
    fp32 panels, bf16 (uint16 bits) widened in registers, or int8 with `scale` [N] (one per output row)."""
    dim(N, "N"), dim(K, "K")
    need(x, "x", F32, (None, K))
    M = dim(x.shape[0], "x rows")
    if p.dtype not in _PACKERS or p.ndim != 1 or p.size != panel_size(N, K):
        raise ValueError(f"p: the panels of an [{N}, {K}] weight ({panel_size(N, K)} values) are needed, not {p.dtype} {tuple(p.shape)}")
    need(p, "p", p.dtype, align=32)
    if b is not None:
        need(b, "b", F32, (N,))
    if (scale is not None) != (p.dtype == I8):
        raise ValueError("scale: needed for int8 panels, and only for them")
    if scale is not None:
        need(scale, "scale", F32, (N,))
    y = np.empty((M, N), dtype=np.float32)
    if M == 0 or N == 0:
        return y
    lib, bias, threads = library(), None if b is None else ptr(b), torch.get_num_threads()
    if p.dtype == F32:
        lib.panel_linear(ptr(x), ptr(p), bias, ptr(y), M, N, K, threads)
    elif p.dtype == U16:
        lib.panel_linear_bf16(ptr(x), ptr(p), bias, ptr(y), M, N, K, threads)
    else:
        lib.panel_linear_i8(ptr(x), ptr(p), ptr(scale), bias, ptr(y), M, N, K, threads)
    return y


def panel(w: torch.Tensor) -> np.ndarray:
    """w [N, K] copied once into the kernel's panels (64-byte aligned), kept on the weight itself (freed with it)."""
    p = getattr(w, _PANEL, None)
    if p is None:
        with lock:  # two sessions' first batches: one copy
            p = getattr(w, _PANEL, None)
            if p is None:
                p = packed_panels(w.detach().numpy())
                setattr(w, _PANEL, p)
    return p


def panel_rows(x: np.ndarray, w: torch.Tensor, b: torch.Tensor | None = None) -> np.ndarray:
    """x [M, K] float32 (numpy) @ w.T (+ b) through pipeline/decode_step/cpu/cpu_decode.c -> a new [M, N] array. The C kernels
    must be built (CHOICE.c_kernels())."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.dtype != torch.float32 or w.device.type != "cpu":
        raise ValueError(f"w: a 2-D float32 CPU tensor is needed, not {getattr(w, 'dtype', type(w).__name__)} {tuple(getattr(w, 'shape', ()))}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    bias = None if b is None else np.ascontiguousarray(b.detach().numpy())
    return panel_product(x, panel(w), w.shape[0], w.shape[1], bias)


def _sgemv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.from_numpy(w.detach().numpy() @ x.detach().reshape(-1).numpy())


@torch.library.custom_op("llm_explorer::sgemv", mutates_args=())
def sgemv(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """OpenBLAS's matrix-vector product as an operator torch.compile calls as it is (an opaque kernel)."""
    return _sgemv(x, w)


@sgemv.register_fake
def _(x, w):
    return x.new_empty(w.shape[0])


def matvec(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """One row: OpenBLAS's sgemv over the weight's own memory (numpy views, nothing copied)."""
    y = sgemv(x, w) if torch.compiler.is_compiling() else _sgemv(x, w)
    return y if b is None else y + b


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, w, b) for x [..., in], through the kernel measured fastest for its number of rows (CHOICE.linear)."""
    kernel = CHOICE.linear(x, w).kernel
    rows = x.numel() // max(1, x.shape[-1])
    lead = x.shape[:-1]
    if kernel == PANEL:
        y = panel_rows(x.detach().reshape(rows, -1).numpy(), w, b)
        return torch.from_numpy(y).reshape(*lead, w.shape[0])
    if kernel == SGEMV:
        return matvec(x, w, b).reshape(*lead, w.shape[0])
    if kernel == ONEDNN_KERNEL:
        out = torch.ops.mkldnn._linear_pointwise(x.reshape(rows, -1).contiguous(), packed(w), b, "none", [], "")
    elif kernel == TALL:
        out = torch.mm(w, x.reshape(rows, -1).t()).t().contiguous()
        if b is not None:
            out = out + b
    else:
        return F.linear(x, w, b)
    return out.reshape(*lead, w.shape[0])
