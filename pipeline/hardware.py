"""Why a GPU: measured matmul throughput of this device, and where a decode step's time goes."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from .models import LoadedModel
from .timing import best_of, ids_of_length, sync

MATMUL_OPS = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::matmul",
    "aten::linear",
    "aten::baddbmm",
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::_scaled_dot_product_efficient_attention",
    "aten::_scaled_dot_product_flash_attention",
    "aten::_scaled_dot_product_cudnn_attention",
)


@dataclass
class MatmulProbe:
    n: int  # an n x n x n matmul
    dtype: str
    seconds: float  # best of the repeats (s)
    tflops: float  # 2 n^3 / seconds / 1e12


@dataclass
class OpShare:
    op: str  # the torch operator
    us: float  # its self time in the profiled step (µs)
    calls: int
    share: float  # of the step's operator time (0-1)
    matmul: bool  # a matrix multiplication


@dataclass
class DecodeProfile:
    """One decode step under torch.profiler."""

    device_time: str  # what the times are: GPU kernel time or CPU operator self time
    total_us: float  # all operators' self time (µs)
    step_ms: float  # the step without the profiler, median of 5 (ms)
    matmul_us: float
    matmul_share: float  # matmul_us / total_us
    top: list[OpShare]  # the 12 costliest operators


def matmul_probe(device: torch.device, dtype: torch.dtype, n: int | None = None, reps: int = 5) -> MatmulProbe:
    """Time an n x n x n matmul on this device: {n, seconds, tflops} (best of reps, after a warm-up)."""
    n = n or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    best = best_of(lambda: a @ b, device, reps)
    return MatmulProbe(n, str(dtype).removeprefix("torch."), best, 2 * n**3 / best / 1e12)


def decode_step_profile(lm: LoadedModel, context: int = 64) -> DecodeProfile:
    """Profile ONE decode step (a single new token over a `context`-token KV cache) with torch.profiler.
    Returns the share of operator time spent in matrix multiplications, and the top operators."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import DynamicCache

    ids = ids_of_length(lm, context)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if lm.device.type == "cuda" else [])
    with lm.lock, torch.inference_mode():
        cache = DynamicCache(config=lm.model.config)
        lm.model(input_ids=ids, past_key_values=cache, use_cache=True)
        nxt = ids[:, -1:]
        lm.model(input_ids=nxt, past_key_values=cache, use_cache=True)  # warm the step
        sync(lm.device)
        plain = []
        for _ in range(5):  # the step's time without the profiler
            t = time.perf_counter()
            lm.model(input_ids=nxt, past_key_values=cache, use_cache=True)
            sync(lm.device)
            plain.append(time.perf_counter() - t)
        with profile(activities=acts) as prof:
            lm.model(input_ids=nxt, past_key_values=cache, use_cache=True)
            sync(lm.device)
    use_cuda = lm.device.type == "cuda"
    rows = []
    for e in prof.key_averages():
        t = (getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)) if use_cuda else e.self_cpu_time_total
        if t > 0:
            rows.append((e.key, t, e.count))
    total = sum(t for _, t, _ in rows) or 1
    mm = sum(t for k, t, _ in rows if k in MATMUL_OPS)
    rows.sort(key=lambda r: -r[1])
    plain.sort()
    return DecodeProfile(
        "GPU kernel time" if use_cuda else "CPU operator self time",
        total,
        plain[len(plain) // 2] * 1000,
        mm,
        mm / total,
        [OpShare(k, t, c, t / total, k in MATMUL_OPS) for k, t, c in rows[:12]],
    )
