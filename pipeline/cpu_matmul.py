"""Matrix products on a CPU, each through the kernel that reads its weight fastest.

A decode step multiplies a few rows of activations by every weight matrix of the model: 538 MB for SmolLM2 in
fp32, read from memory once per step. At 1 row the product is memory-bound (one multiply-add per 4 bytes read),
so what decides its speed is how close the kernel streams at the machine's read bandwidth; at 2-64 rows it is
how little the kernel spends re-arranging the weight on every call. Measured on the project's 2-core build
machine (AMD EPYC, bench/bench_cpu_anchor.py and bench/bench_linear.py; every weight of the model, medians):

  rows  torch F.linear (MKL)   W @ xᵀ (MKL)   OpenBLAS (numpy)   oneDNN, weight packed once
     1        73-82 ms            72 ms           42-45 ms            60-68 ms
     8          174 ms           155 ms             93 ms               74-82 ms
    32          257 ms           139 ms            168 ms              129-137 ms

so `linear` sends
  * 1 row to OpenBLAS's matrix-vector kernel (numpy's `W @ x` on the same memory, no copy): 12 GB/s against
    MKL's 7 GB/s, which on this AMD processor never reaches the memory's speed at one row;
  * 2 to PACKED_MAX_ROWS rows to oneDNN with the weight re-laid once in oneDNN's blocked layout
    (`torch.ops.mkldnn._reorder_linear_weight`, kept beside the weight: a second copy of it, made the first
    time the engine batches). Its rows do not depend on each other: a row gives the same numbers alone or with
    31 others (tests/pipeline/test_fused.py);
  * up to TALL_MAX_ROWS rows to MKL as W @ xᵀ; above, F.linear (a prompt of hundreds of tokens is compute-bound
    and MKL's GEMM is good at it).
Every path computes the same products in another summation order: within 1e-4 of F.linear on the model's
projections (tests/pipeline/test_fused.py against float64). On a GPU, with other dtypes, or with KERNELS off,
everything is F.linear.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

KERNELS = True  # bench/bench_linear.py turns it off to measure what the choice gives
PACKED_MAX_ROWS = 64  # 2..64 rows: oneDNN with a packed weight
TALL_MAX_ROWS = 128  # 65..128 rows: MKL's W @ xᵀ; above: F.linear (252 prompt rows: W @ xᵀ ran 0.89x as fast)
PACK_HINT = 16  # the batch size oneDNN lays the weight out for (8-32 rows within 5% of their own hint)
_PACKED = "_onednn_packed"  # the attribute under which a weight keeps its packed copy


def _onednn() -> bool:
    try:
        return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    except Exception:  # noqa: BLE001 - a build without oneDNN: MKL paths only
        return False


ONEDNN = _onednn()


def packed(w: torch.Tensor) -> torch.Tensor:
    """w re-laid for oneDNN, made once and kept on the weight itself (freed with it)."""
    p = getattr(w, _PACKED, None)
    if p is None:
        p = torch.ops.mkldnn._reorder_linear_weight(w.detach(), PACK_HINT)
        setattr(w, _PACKED, p)
    return p


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


def usable(x: torch.Tensor, w: torch.Tensor) -> bool:
    return KERNELS and x.device.type == "cpu" and x.dtype == w.dtype == torch.float32 and w.dim() == 2 and w.is_contiguous()


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, w, b) for x [..., in], through the kernel measured fastest for its number of rows (above)."""
    rows = x.numel() // max(1, x.shape[-1])
    if not usable(x, w) or rows == 0:
        return F.linear(x, w, b)
    lead = x.shape[:-1]
    if rows == 1:
        return matvec(x, w, b).reshape(*lead, w.shape[0])
    x2 = x.reshape(rows, -1)
    if rows <= PACKED_MAX_ROWS and ONEDNN:
        out = torch.ops.mkldnn._linear_pointwise(x2.contiguous(), packed(w), b, "none", [], "")
    elif rows <= TALL_MAX_ROWS:
        out = torch.mm(w, x2.t()).t().contiguous()
        if b is not None:
            out = out + b
    else:
        return F.linear(x, w, b)
    return out.reshape(*lead, w.shape[0])
