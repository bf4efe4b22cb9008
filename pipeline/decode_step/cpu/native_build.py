"""Building and loading pipeline/decode_step/cpu/cpu_decode.c: the compiler's flags, the library's name in the cache (the source's
and the flags' hash), the processor check, and each exported function's C signature for ctypes. pipeline.decode_step.cpu.library's
`loaded()` builds it once per process through `build()`; every call into it goes through a checked entry point
(pipeline.decode_step.cpu.matmul, norms, paged_attention, greedy, layer_call), and pipeline.decode_step.choice decides where it serves."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
from pathlib import Path

import torch

NATIVE_SOURCE = Path(__file__).with_name("cpu_decode.c")
_CFLAGS = ["-O3", "-mavx2", "-mfma", "-fopenmp", "-shared", "-fPIC"]
log = logging.getLogger(__name__)


def cpu_has_avx2_fma() -> bool:
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags")).split()
    except (OSError, StopIteration):
        return torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512")
    return "avx2" in flags and "fma" in flags


SANITIZE_ENV = "LLM_EXPLORER_KERNEL_SANITIZE"  # =1: built with -fsanitize=address,undefined (the sanitizer test)


def flags() -> list[str]:
    """gcc's flags for pipeline/decode_step/cpu/cpu_decode.c (with the sanitizers when LLM_EXPLORER_KERNEL_SANITIZE=1)."""
    if os.environ.get(SANITIZE_ENV, "") == "1":
        return [*_CFLAGS[:1], "-g", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=all", *_CFLAGS[1:]]
    return list(_CFLAGS)


def library_name() -> str:
    """The library's file name in `<cache>/kernels/`: the source's and the flags' hash in it."""
    fl = flags()
    tag = hashlib.sha256(NATIVE_SOURCE.read_bytes() + " ".join(fl).encode()).hexdigest()[:16]
    return f"cpu_decode-{tag}{'-san' if fl != _CFLAGS else ''}.so"


def kernels_dir() -> Path:
    """Where the built library is kept: `<cache>/kernels`, or LLM_EXPLORER_KERNELS."""
    from pipeline.model.registry import cache_dir

    return Path(os.environ.get("LLM_EXPLORER_KERNELS") or cache_dir() / "kernels")


def build() -> ctypes.CDLL | None:
    """The kernel's shared library, compiled once per source and machine into the cache and loaded only when
    verified (pipeline/decode_step/trusted.py); None where it cannot be built or trusted (the reason is logged)."""
    if os.environ.get("LLM_EXPLORER_PANEL", "1") == "0" or not cpu_has_avx2_fma():
        return None
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        log.info("no C compiler: CPU decode uses OpenBLAS and oneDNN")
        return None
    from pipeline.decode_step.trusted import library

    lib = library(NATIVE_SOURCE, flags(), kernels_dir(), library_name(), cc)
    if lib is None:
        return None
    ptr, i = ctypes.c_void_p, ctypes.c_int
    lib.pack.argtypes = [ptr, ptr, i, i]
    lib.pack.restype = None
    lib.panel_linear.argtypes = [ptr, ptr, ptr, ptr, i, i, i, i]
    lib.panel_linear.restype = None
    lg = ctypes.c_long
    lib.paged_attend.argtypes = [ptr, ptr, ptr, lg, lg, lg, ptr, i, ptr, ptr, i, i, i, i, i, ctypes.c_float, ptr, i, ptr]
    lib.paged_attend.restype = None
    for name in ("pack_i8", "pack_u16"):
        getattr(lib, name).argtypes = [ptr, ptr, i, i]
        getattr(lib, name).restype = None
    lib.panel_linear_i8.argtypes = [ptr, ptr, ptr, ptr, ptr, i, i, i, i]
    lib.panel_linear_i8.restype = None
    lib.panel_linear_bf16.argtypes = [ptr, ptr, ptr, ptr, i, i, i, i]
    lib.panel_linear_bf16.restype = None
    f = ctypes.c_float
    lib.read_sum.argtypes = [ptr, ctypes.c_long, i]
    lib.read_sum.restype = ctypes.c_double
    lib.rms_norm.argtypes = [ptr, ptr, ptr, i, i, f]
    lib.rms_norm.restype = None
    lib.silu_mul.argtypes = [ptr, ptr, ptr, i, i, i]
    lib.silu_mul.restype = None
    lib.greedy_summary.argtypes = [ptr, i, i, i, ptr, ptr, ptr, ptr]
    lib.greedy_summary.restype = None
    # x, M, d, H, KV, D, I, the norms (scale, eps) x 2, the four products' panels and biases, cos, sin, K, V, their
    # three strides, blk, off, tables, max blocks, lo, hi, block size, scale, workspace, threads, failed
    lib.row_layer.argtypes = [ptr, *[i] * 6, ptr, f, ptr, f, *[ptr] * 10, ptr, ptr, lg, lg, lg, ptr, ptr, ptr, i, ptr, ptr, i, f, ptr, i, ptr]
    lib.row_layer.argtypes += [ptr] * 4  # the four products' int8 scales (NULL: fp32 panels)
    lib.row_layer.restype = None
    # the same for L layers in one call: L, then as row_layer with each layer's norms and products as arrays of L
    # pointers (their epsilons as arrays of L floats) and the KV memory's floats per layer after K, V
    lib.row_layers.argtypes = [i, ptr, *[i] * 6, *[ptr] * 14, ptr, ptr, lg, lg, lg, lg, ptr, ptr, ptr, i, ptr, ptr, i, f, ptr, i, ptr]
    lib.row_layers.argtypes += [ptr, f, ptr, ptr, i, ptr, i, ptr]  # then the final norm and LM head (NULL: none)
    lib.row_layers.argtypes += [ptr] * 5  # the products' int8 scales (arrays of L; NULL: fp32 panels), the head's
    lib.row_layers.restype = None
    # steps, embedding table, RoPE tables, tok, pos, stop, S, left, flag, k, the summaries' four outputs, cos/sin, blk,
    # off and hi workspace; then row_layers' arguments less cos, sin, blk, off, hi and the head's MK
    lib.row_steps.argtypes = [i, ptr, ptr, ptr, ptr, ptr, ptr, i, ptr, ptr, i, ptr, ptr, ptr, ptr, ptr, ptr, ptr, ptr]
    lib.row_steps.argtypes += [i, ptr, *[i] * 6, *[ptr] * 12, ptr, ptr, lg, lg, lg, lg, ptr, i, ptr, i, f, ptr, i, ptr]
    lib.row_steps.argtypes += [ptr, f, ptr, ptr, i, ptr, ptr, *[ptr] * 5]  # ..., then the int8 scales as row_layers'
    lib.row_steps.restype = i
    return lib
