"""The built pipeline/decode_step/cpu/cpu_decode.c, loaded once per process, and what every call into it checks first.

    lib = loaded()             # the library (built by native_build, verified by trusted), or None where it cannot be
    lib = library()            # the same, or a RuntimeError: for the checked entry points, which run only where it is

Which path serves a product, a norm or a pass (these kernels or torch's) is not decided here: pipeline.decode_step.choice
is the one place that asks `loaded()` and says why. The C functions trust their arguments; every call goes through
one of the checked entry points (pipeline.decode_step.cpu.matmul, norms, paged_attention, greedy, layer_call), which check in
Python, with `need` and `dim`, what the C would otherwise read or write out of bounds (shapes, dtypes, contiguity,
alignment, index ranges) and raise a ValueError naming the argument. Measured cost: ~1-2 µs a call, ~0.5 ms of a
25-40 ms decode step.
"""

from __future__ import annotations

import ctypes
import threading

import numpy as np

from pipeline.decode_step.cpu.native_build import build

# re-entrant: matmul.panel() packs under it, and packing builds the library first where nothing has yet (a plain Lock
# deadlocked a process whose first kernel call was panel())
lock = threading.RLock()
_lib: ctypes.CDLL | None | bool = False  # False: not tried yet; None: not available here


def loaded() -> ctypes.CDLL | None:
    """The built kernels, or None (no compiler, no AVX2/FMA, LLM_EXPLORER_PANEL=0, or not trusted: the log says)."""
    global _lib
    if _lib is False:
        with lock:
            if _lib is False:
                _lib = build()
    return _lib


def library() -> ctypes.CDLL:
    """The built kernels, for a checked entry point: a RuntimeError where they are not built."""
    lib = loaded()
    if lib is None:
        raise RuntimeError("pipeline/decode_step/cpu/cpu_decode.c is not built on this machine")
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


F32, I8, U16, I32 = np.dtype(np.float32), np.dtype(np.int8), np.dtype(np.uint16), np.dtype(np.int32)


def need(a, name: str, dtype: np.dtype, shape: tuple | None = None, align: int = 4) -> None:
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


def dim(n: int, name: str) -> int:
    """n as a C int, or a ValueError naming it."""
    if not 0 <= n < 2**31:
        raise ValueError(f"{name}: {n} is out of range for the kernel")
    return int(n)
