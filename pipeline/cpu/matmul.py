"""Matrix products on a CPU, each through the kernel that reads its weight fastest.

A decode step multiplies a few rows of activations by every weight matrix of the model: 538 MB for SmolLM2 in
fp32, read from memory once per step. At 1 row the product is memory-bound (one multiply-add per 4 bytes read);
at 8 rows a kernel must still stream the weight at the memory's speed while doing 8 times the arithmetic; at 32,
arithmetic starts to decide. Every weight of the model, back to back, on the project's 2-core build machine
(AMD EPYC, AVX2; medians of 5, one session each; the column on the right from the session that wrote it):

  rows  torch F.linear (MKL)   W @ xᵀ (MKL)   OpenBLAS (numpy)   oneDNN, packed once   pipeline/cpu/cpu_decode.c
     1        73-82 ms            72 ms           36-45 ms            40-68 ms              36-42 ms
     8          174 ms           155 ms           81-93 ms            74-91 ms              37-46 ms
    32          257 ms           139 ms          155-168 ms          129-155 ms             86-95 ms

No library kernel does 2-64 rows well on this processor, so `linear` sends 1 to PANEL_MAX_ROWS rows to our own
kernel, pipeline/cpu/cpu_decode.c (C, AVX2 + FMA; its comment says how it works). gcc builds it once per machine
into the model cache (about a second, on the first decode step); the weight is copied once into the kernel's
panel layout and kept beside it (a second copy of the weights: +538 MB for SmolLM2). Each output is one sum
over k in order, so a row's numbers do not depend on how many rows share the call, or which thread computes
them: a request gets the same logits alone as inside any batch, bit for bit. What it gives the whole step and
the engine (bench/bench_linear.py, bench/bench_cpu_anchor.py, 2026-12-02): a decode step of 1, 8 and 12 rows in
28.8, 40.6 and 45.0 ms (the torch step with F.linear: 61, 126, 142); one request 25.0 tok/s against 19.8 on the
fallback kernels below (one row is bandwidth-bound either way), 8 at once 116 against 69 (in an hour when the
machine read 14 GB/s).

Without a C compiler or AVX2/FMA (or with LLM_EXPLORER_PANEL=0), the measured next-best kernels:
  * 1 row: OpenBLAS's matrix-vector kernel (numpy's `W @ x` on the same memory, no copy): 12 GB/s against
    MKL's 7 GB/s, which on this AMD processor never reaches the memory's speed at one row;
  * 2 to PANEL_MAX_ROWS rows: oneDNN with the weight re-laid once in its blocked layout
    (`torch.ops.mkldnn._reorder_linear_weight`, kept beside the weight).
Above: up to TALL_MAX_ROWS rows MKL as W @ xᵀ, then F.linear (a prompt of hundreds of tokens is compute-bound
and MKL's GEMM is good at it). Every path computes the same products in another summation order: within 1e-4
of F.linear on the model's projections (tests/pipeline/test_fused.py and test_row_step.py against float64). On
a GPU, with other dtypes, or with KERNELS off, everything is F.linear.
"""

from __future__ import annotations

import ctypes
import logging
import mmap
import threading

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.cpu.native_build import build
from pipeline.forward.sampling import GreedySummary

KERNELS = True  # bench/bench_linear.py turns it off to measure what the choice gives
PANEL_MAX_ROWS = 64  # 1..64 rows: pipeline/cpu/cpu_decode.c (or, without it, 1 row OpenBLAS and 2..64 oneDNN)
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


# ------------------------------------------------------------------------------------- pipeline/cpu/cpu_decode.c
_PANEL = "_panel_packed"
# re-entrant: panel() packs under it, and packing builds the library first where nothing has yet (a plain Lock
# deadlocked a process whose first kernel call was panel())
_lib_lock = threading.RLock()
_lib: ctypes.CDLL | None | bool = False  # False: not tried yet; None: not available here
log = logging.getLogger(__name__)


def _data_offset() -> int | None:
    """Where a numpy array object keeps its data pointer: right after the object header (numpy's stable
    PyArrayObject layout; in CPython id() is the object's address). Checked here, else None."""
    probe = np.zeros(3, dtype=np.float32)[1:]
    off = ctypes.sizeof(ctypes.c_ssize_t) + ctypes.sizeof(ctypes.c_void_p)
    try:
        return off if ctypes.c_void_p.from_address(id(probe) + off).value == probe.ctypes.data else None
    except (OSError, ValueError):  # noqa: PERF203 - another interpreter
        return None


_OFF = _data_offset()
_void_at = ctypes.c_void_p.from_address


def ptr(a: np.ndarray) -> int:
    """The address of a numpy array's first element, in 0.2 µs (`a.ctypes.data` takes 1.5-3: a step makes ~400
    such calls)."""
    return _void_at(id(a) + _OFF).value if _OFF is not None else a.ctypes.data


def native() -> ctypes.CDLL | None:
    """The built kernel, or None (no compiler, no AVX2/FMA, LLM_EXPLORER_PANEL=0, or KERNELS off)."""
    global _lib
    if not KERNELS:
        return None
    if _lib is False:
        with _lib_lock:
            if _lib is False:
                _lib = build()
    return _lib


HUGE_PAGE = 2 << 20


def aligned(size: int, dtype) -> np.ndarray:
    """An empty array of `size` elements in its own private anonymous memory map, given back to the system the moment
    the array is dropped (from malloc, freed panel copies stayed in the process: three runs of page 12's precision
    lesson grew a process by 0.74 GB that did not come back). Arrays of 2 MiB or more start on a 2 MiB boundary and
    their whole 2 MiB pages are advised as transparent huge pages (the tail, under 2 MiB, stays in 4 KiB pages, so no
    memory is spent on padding). Why (measured 2026-12-05, this project's 2-core VM, in the read probe's fast minutes):
    the same read_sum over a buffer of 4 KiB pages read 55-58 GB/s where one in huge pages read 62-64 (numpy gives its
    own large arrays huge pages, so the read probe's buffer had them and the panels, from Python's mmap, did not; the
    first pages a process gets are the most scattered: 55 against 62 for later ones). In normal minutes they read
    alike. A shared map (Python mmap's default) never gets huge pages here (shmem_enabled is `never`)."""
    nbytes = max(1, size * np.dtype(dtype).itemsize)
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    if nbytes < HUGE_PAGE:
        return np.frombuffer(mmap.mmap(-1, nbytes, flags=flags), dtype=dtype, count=size)
    m = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=flags)  # the part before the boundary is never touched: no memory
    off = -np.frombuffer(m, dtype=np.uint8, count=1).ctypes.data % HUGE_PAGE
    try:
        m.madvise(mmap.MADV_HUGEPAGE, off, nbytes // HUGE_PAGE * HUGE_PAGE)
    except (AttributeError, OSError):  # no transparent huge pages here: 4 KiB pages, as before
        pass
    return np.frombuffer(m, dtype=dtype, count=size, offset=off)


# ---------------------------------------------------------------- the checked entry points into cpu_decode.c
# The C functions trust their arguments; every call goes through one of these, which check in Python what the C
# would otherwise read or write out of bounds (shapes, dtypes, contiguity, alignment, index ranges) and raise a
# ValueError naming the argument. Measured cost: ~1-2 µs a call, ~0.5 ms of a 25-40 ms decode step.
F32, I8, U16, I32 = np.dtype(np.float32), np.dtype(np.int8), np.dtype(np.uint16), np.dtype(np.int32)
_PACKERS = {F32: "pack", I8: "pack_i8", U16: "pack_u16"}


def _need(a, name: str, dtype: np.dtype, shape: tuple | None = None, align: int = 4) -> None:
    """Raise ValueError unless `a` is a C-contiguous numpy array of `dtype` (and `shape`, where an entry of None
    matches any size), its data aligned to `align` bytes."""
    if not isinstance(a, np.ndarray):
        raise ValueError(f"{name}: a numpy array is needed, not {type(a).__name__}")
    if a.dtype != dtype:
        raise ValueError(f"{name}: dtype {a.dtype}, {dtype} needed")
    if not a.flags.c_contiguous:
        raise ValueError(f"{name}: not C-contiguous")
    if shape is not None and (a.ndim != len(shape) or any(w is not None and w != n for w, n in zip(shape, a.shape))):
        raise ValueError(f"{name}: shape {tuple(a.shape)}, {tuple('any' if w is None else w for w in shape)} needed")
    if a.size and ptr(a) % align:
        raise ValueError(f"{name}: data not aligned to {align} bytes")


def _dim(n: int, name: str) -> int:
    if not 0 <= n < 2**31:
        raise ValueError(f"{name}: {n} is out of range for the kernel")
    return int(n)


def _library() -> ctypes.CDLL:
    lib = native()
    if lib is None:
        raise RuntimeError("pipeline/cpu/cpu_decode.c is not built on this machine")
    return lib


def panel_size(N: int, K: int) -> int:
    """Elements of the panel copy of an [N, K] weight: ceil(N / 16) panels of K x 16."""
    return -(-N // 16) * 16 * K


def packed_panels(w: np.ndarray) -> np.ndarray:
    """A C-contiguous [N, K] array of float32, int8 or uint16 (bf16 bits) copied into the kernel's panels."""
    if not isinstance(w, np.ndarray) or w.ndim != 2 or w.dtype not in _PACKERS:
        raise ValueError(f"w: a 2-D float32, int8 or uint16 array is needed, not {getattr(w, 'dtype', type(w).__name__)} {getattr(w, 'shape', '')}")
    N, K = _dim(w.shape[0], "w rows"), _dim(w.shape[1], "w columns")
    p = aligned(panel_size(N, K), w.dtype)
    src = np.ascontiguousarray(w)  # held in a name: a temporary's memory could be freed before the call reads it
    getattr(_library(), _PACKERS[w.dtype])(ptr(src), ptr(p), N, K)
    return p


def panel_product(x: np.ndarray, p: np.ndarray, N: int, K: int, b: np.ndarray | None = None, scale: np.ndarray | None = None) -> np.ndarray:
    """x [M, K] float32 @ W.T (+ b) -> a new [M, N] float32, W [N, K] given as its panels `p` (packed_panels):
    fp32 panels, bf16 (uint16 bits) widened in registers, or int8 with `scale` [N] (one per output row)."""
    _dim(N, "N"), _dim(K, "K")
    _need(x, "x", F32, (None, K))
    M = _dim(x.shape[0], "x rows")
    if p.dtype not in _PACKERS or p.ndim != 1 or p.size != panel_size(N, K):
        raise ValueError(f"p: the panels of an [{N}, {K}] weight ({panel_size(N, K)} values) are needed, not {p.dtype} {tuple(p.shape)}")
    _need(p, "p", p.dtype, align=32)
    if b is not None:
        _need(b, "b", F32, (N,))
    if (scale is not None) != (p.dtype == I8):
        raise ValueError("scale: needed for int8 panels, and only for them")
    if scale is not None:
        _need(scale, "scale", F32, (N,))
    y = np.empty((M, N), dtype=np.float32)
    if M == 0 or N == 0:
        return y
    lib, bias, threads = _library(), None if b is None else ptr(b), torch.get_num_threads()
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
        with _lib_lock:  # two sessions' first batches: one copy
            p = getattr(w, _PANEL, None)
            if p is None:
                p = packed_panels(w.detach().numpy())
                setattr(w, _PANEL, p)
    return p


def panel_rows(x: np.ndarray, w: torch.Tensor, b: torch.Tensor | None = None) -> np.ndarray:
    """x [M, K] float32 (numpy) @ w.T (+ b) through pipeline/cpu/cpu_decode.c -> a new [M, N] array. native() must
    be available."""
    if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.dtype != torch.float32 or w.device.type != "cpu":
        raise ValueError(f"w: a 2-D float32 CPU tensor is needed, not {getattr(w, 'dtype', type(w).__name__)} {tuple(getattr(w, 'shape', ()))}")
    x = np.ascontiguousarray(x, dtype=np.float32)
    bias = None if b is None else np.ascontiguousarray(b.detach().numpy())
    return panel_product(x, panel(w), w.shape[0], w.shape[1], bias)


def paged_attend(q: np.ndarray, K: np.ndarray, V: np.ndarray, tables: np.ndarray, lo: np.ndarray, hi: np.ndarray, bs: int, scale, threads: int) -> np.ndarray:
    """Decode attention over paged keys and values where they lie (cpu_decode.c's `paged_attend`): q [B, KV, G, D]
    float32; K and V one layer's blocks [blocks, KV, bs, D] (or a static buffer [KV, max_len, D], one block of
    bs = max_len), the same shape and strides, each position's D values contiguous; tables [B, max_blocks] int32
    block numbers; row b attends to positions lo[b] <= p < hi[b] (int32 [B]). -> [B, KV * G * D]."""
    _need(q, "q", F32, (None, None, None, None))
    B, KVh, G, D = (_dim(n, f"q.shape[{i}]") for i, n in enumerate(q.shape))
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
    _need(tables, "tables", I32, (B, None))
    _need(lo, "lo", I32, (B,))
    _need(hi, "hi", I32, (B,))
    out = np.empty((B, KVh * G * D), dtype=np.float32)
    if B == 0 or KVh * G * D == 0:
        return out
    mb = _dim(tables.shape[1], "tables columns")
    if mb == 0 or np.any(lo < 0) or np.any(hi <= lo) or np.any(hi > mb * bs):
        raise ValueError(f"lo, hi: every row needs 0 <= lo < hi <= {mb} blocks x {bs} positions")
    if tables.min() < 0 or tables.max() >= blocks:  # unused entries must be real blocks too (callers pad with 0)
        raise ValueError(f"tables: a block number outside 0..{blocks - 1}")
    if K.ndim == 3:  # a static buffer: one block of max_len positions
        s_blk, s_kv, s_pos = 0, K.strides[0] // 4, K.strides[1] // 4
    else:
        s_blk, s_kv, s_pos = K.strides[0] // 4, K.strides[1] // 4, K.strides[2] // 4
    failed = ctypes.c_int(0)
    _library().paged_attend(
        ptr(q),
        ptr(K),
        ptr(V),
        s_blk,
        s_kv,
        s_pos,
        ptr(tables),
        mb,
        ptr(lo),
        ptr(hi),
        B,
        KVh,
        G,
        D,
        int(bs),
        float(scale),
        ptr(out),
        int(threads),
        ctypes.byref(failed),
    )
    if failed.value:
        raise MemoryError("paged_attend: no memory for the attention scores")
    return out


def rms_norm(x: np.ndarray, scale: np.ndarray, eps: float) -> np.ndarray:
    """x [..., D] float32 (C-contiguous): each row / sqrt(mean(row^2) + eps) * scale [D] -> a new array."""
    _need(x, "x", F32)
    D = _dim(x.shape[-1] if x.ndim else 0, "x width")
    _need(scale, "scale", F32, (D,))
    y = np.empty_like(x)
    if x.size:
        _library().rms_norm(ptr(x), ptr(scale), ptr(y), _dim(x.size // D, "x rows"), D, float(eps))
    return y


def silu_mul(gu: np.ndarray) -> np.ndarray:
    """gu = [g | u] [M, 2N] float32 (C-contiguous) -> silu(g) * u [M, N]."""
    _need(gu, "gu", F32, (None, None))
    M, two = gu.shape
    if two % 2:
        raise ValueError(f"gu: an even width is needed (g and u side by side), not {two}")
    N = two // 2
    y = np.empty((M, N), dtype=np.float32)
    if gu.size:
        _library().silu_mul(ptr(gu), ptr(gu) + 4 * N, ptr(y), _dim(M, "gu rows"), _dim(N, "gu width"), two)
    return y


def greedy_summary(logits: torch.Tensor, k: int) -> GreedySummary:
    """GreedySummary.of(logits, k) for float32 logits [V] or [rows, V] on a CPU, in one C call (cpu_decode.c's
    greedy_summary: one thread, where torch's three reductions each woke the OpenMP team); torch's elsewhere and
    inside torch.compile (a traced step has no call out to C)."""
    if (
        torch.compiler.is_compiling()
        or logits.device.type != "cpu"
        or logits.dtype != torch.float32
        or logits.ndim not in (1, 2)
        or not logits.shape[-1]
        or (lib := native()) is None
    ):
        return GreedySummary.of(logits, k)
    x = np.ascontiguousarray(logits.detach().numpy().reshape(-1, logits.shape[-1]))
    rows, V = x.shape
    k = min(int(k), V)
    am, lse = np.empty(rows, dtype=np.int64), np.empty(rows, dtype=np.float32)
    vals, ids = np.empty((rows, k), dtype=np.float32), np.empty((rows, k), dtype=np.int64)
    if rows:
        lib.greedy_summary(ptr(x), _dim(rows, "logits rows"), _dim(V, "vocabulary"), _dim(k, "k"), ptr(am), ptr(lse), ptr(vals), ptr(ids))
    out = GreedySummary(*(torch.from_numpy(a) for a in (am, lse, vals, ids)))
    return out if logits.ndim == 2 else out.row(0)


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


def kernel_for(rows: int) -> str:
    """THE choice of kernel for `rows` rows times a weight on this CPU, measured fastest (the table above): "panel"
    (pipeline/cpu/cpu_decode.c, 1-64 rows), else "sgemv" (one row, OpenBLAS), "onednn" (2-64 rows, packed once),
    "tall" (65-128 rows, MKL's W @ xᵀ) or "torch" (F.linear). `linear` and the row step both ask it."""
    if rows <= PANEL_MAX_ROWS and not torch.compiler.is_compiling() and native() is not None:
        return "panel"
    if rows == 1:
        return "sgemv"
    if rows <= PANEL_MAX_ROWS and ONEDNN:
        return "onednn"
    return "tall" if rows <= TALL_MAX_ROWS else "torch"


def linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, w, b) for x [..., in], through the kernel measured fastest for its number of rows (kernel_for)."""
    rows = x.numel() // max(1, x.shape[-1])
    if not usable(x, w) or rows == 0:
        return F.linear(x, w, b)
    lead = x.shape[:-1]
    kernel = kernel_for(rows)
    if kernel == "panel":
        y = panel_rows(x.detach().reshape(rows, -1).numpy(), w, b)
        return torch.from_numpy(y).reshape(*lead, w.shape[0])
    if kernel == "sgemv":
        return matvec(x, w, b).reshape(*lead, w.shape[0])
    x2 = x.reshape(rows, -1)
    if kernel == "onednn":
        out = torch.ops.mkldnn._linear_pointwise(x2.contiguous(), packed(w), b, "none", [], "")
    elif kernel == "tall":
        out = torch.mm(w, x2.t()).t().contiguous()
        if b is not None:
            out = out + b
    else:
        return F.linear(x, w, b)
    return out.reshape(*lead, w.shape[0])
