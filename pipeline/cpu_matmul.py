"""Matrix products on a CPU, each through the kernel that reads its weight fastest.

A decode step multiplies a few rows of activations by every weight matrix of the model: 538 MB for SmolLM2 in
fp32, read from memory once per step. At 1 row the product is memory-bound (one multiply-add per 4 bytes read);
at 8 rows a kernel must still stream the weight at the memory's speed while doing 8 times the arithmetic; at 32,
arithmetic starts to decide. Every weight of the model, back to back, on the project's 2-core build machine
(AMD EPYC, AVX2; medians of 5, one session each; the column on the right from the session that wrote it):

  rows  torch F.linear (MKL)   W @ xᵀ (MKL)   OpenBLAS (numpy)   oneDNN, packed once   pipeline/cpu_decode.c
     1        73-82 ms            72 ms           36-45 ms            40-68 ms              36-42 ms
     8          174 ms           155 ms           81-93 ms            74-91 ms              37-46 ms
    32          257 ms           139 ms          155-168 ms          129-155 ms             86-95 ms

No library kernel does 2-64 rows well on this processor, so `linear` sends 1 to PANEL_MAX_ROWS rows to our own
kernel, pipeline/cpu_decode.c (C, AVX2 + FMA; its comment says how it works). gcc builds it once per machine
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
import hashlib
import logging
import mmap
import os
import platform
import shutil
import subprocess
import threading
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

KERNELS = True  # bench/bench_linear.py turns it off to measure what the choice gives
PANEL_MAX_ROWS = 64  # 1..64 rows: pipeline/cpu_decode.c (or, without it, 1 row OpenBLAS and 2..64 oneDNN)
PACKED_MAX_ROWS = PANEL_MAX_ROWS
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


# ------------------------------------------------------------------------------------- pipeline/cpu_decode.c
NATIVE_SOURCE = Path(__file__).with_name("cpu_decode.c")
_PANEL = "_panel_packed"
_CFLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC"]
_lib_lock = threading.Lock()
_lib: ctypes.CDLL | None | bool = False  # False: not tried yet; None: not available here
log = logging.getLogger(__name__)


def _cpu_has_avx2_fma() -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    return "avx2" in flags and "fma" in flags


def _build() -> ctypes.CDLL | None:
    """The kernel's shared library, compiled once per source and machine into the cache (None where it cannot be)."""
    if os.environ.get("LLM_EXPLORER_PANEL", "1") == "0" or not _cpu_has_avx2_fma():
        return None
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        log.info("no C compiler: CPU decode uses OpenBLAS and oneDNN")
        return None
    from .models import cache_dir

    tag = hashlib.sha256(NATIVE_SOURCE.read_bytes() + " ".join(_CFLAGS).encode()).hexdigest()[:16]
    out = cache_dir() / "kernels" / f"cpu_decode-{tag}.so"
    try:
        if not out.exists():
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(f"{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
            subprocess.run([cc, *_CFLAGS, str(NATIVE_SOURCE), "-o", str(tmp), "-lm"], check=True, capture_output=True, timeout=120)
            os.replace(tmp, out)  # atomic: two processes building at once both end with a whole file
        lib = ctypes.CDLL(str(out))
    except (OSError, subprocess.SubprocessError) as e:
        log.warning("pipeline/cpu_decode.c did not build (%s): CPU decode uses OpenBLAS and oneDNN", e)
        return None
    ptr, i = ctypes.c_void_p, ctypes.c_int
    lib.pack.argtypes = [ptr, ptr, i, i]
    lib.pack.restype = None
    lib.panel_linear.argtypes = [ptr, ptr, ptr, ptr, i, i, i, i]
    lib.panel_linear.restype = None
    lg = ctypes.c_long
    lib.paged_attend.argtypes = [ptr, ptr, ptr, lg, lg, lg, ptr, i, ptr, ptr, i, i, i, i, i, ctypes.c_float, ptr, i]
    lib.paged_attend.restype = None
    for name in ("pack_i8", "pack_u16"):
        getattr(lib, name).argtypes = [ptr, ptr, i, i]
        getattr(lib, name).restype = None
    lib.panel_linear_i8.argtypes = [ptr, ptr, ptr, ptr, ptr, i, i, i, i]
    lib.panel_linear_i8.restype = None
    lib.panel_linear_bf16.argtypes = [ptr, ptr, ptr, ptr, i, i, i, i]
    lib.panel_linear_bf16.restype = None
    f = ctypes.c_float
    lib.rms_norm.argtypes = [ptr, ptr, ptr, i, i, f]
    lib.rms_norm.restype = None
    lib.silu_mul.argtypes = [ptr, ptr, ptr, i, i, i]
    lib.silu_mul.restype = None
    return lib


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
                _lib = _build()
    return _lib


def _aligned(size: int, dtype) -> np.ndarray:
    """An empty array of `size` elements in its own anonymous memory map: page-aligned (so on a cache line), and
    given back to the system the moment the array is dropped. (From malloc, freed panel copies stayed in the
    process: three runs of page 12's precision lesson grew a process by 0.74 GB that did not come back.)"""
    nbytes = max(1, size * np.dtype(dtype).itemsize)
    return np.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype, count=size)


def packed_panels(w: np.ndarray) -> np.ndarray:
    """A C-contiguous [N, K] array of float32, int8 or uint16 (bf16 bits) copied into the kernel's panels."""
    N, K = w.shape
    fn = {np.dtype(np.float32): "pack", np.dtype(np.int8): "pack_i8", np.dtype(np.uint16): "pack_u16"}[w.dtype]
    p = _aligned(-(-N // 16) * 16 * K, w.dtype)
    src = np.ascontiguousarray(w)  # held in a name: a temporary's memory could be freed before the call reads it
    getattr(native(), fn)(ptr(src), ptr(p), N, K)
    return p


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
    """x [M, K] float32 (numpy) @ w.T (+ b) through pipeline/cpu_decode.c -> a new [M, N] array. native() must
    be available."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    M, K = x.shape
    N = w.shape[0]
    y = np.empty((M, N), dtype=np.float32)
    bias = None if b is None else b.data_ptr()
    native().panel_linear(ptr(x), ptr(panel(w)), bias, ptr(y), M, N, K, torch.get_num_threads())
    return y


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
    if rows <= PANEL_MAX_ROWS and not torch.compiler.is_compiling() and native() is not None:
        y = panel_rows(x.detach().reshape(rows, -1).numpy(), w, b)
        return torch.from_numpy(y).reshape(*lead, w.shape[0])
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
