"""Why a GPU: measured matmul throughput of this device, and where a decode step's time goes."""
from __future__ import annotations

import time

import torch

from .models import LoadedModel

MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm",
              "aten::_scaled_dot_product_flash_attention_for_cpu", "aten::_scaled_dot_product_efficient_attention",
              "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_cudnn_attention")


def _sync(dev: torch.device):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def matmul_probe(device: torch.device, dtype: torch.dtype, n: int | None = None, reps: int = 5) -> dict:
    """Time an n x n x n matmul on this device: {n, seconds, tflops} (best of reps, after a warm-up)."""
    n = n or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    _sync(device)
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - t)
    return {"n": n, "dtype": str(dtype).removeprefix("torch."), "seconds": best, "tflops": 2 * n ** 3 / best / 1e12}


def decode_step_profile(lm: LoadedModel, context: int = 64) -> dict:
    """Profile ONE decode step (a single new token over a `context`-token KV cache) with torch.profiler.
    Returns the share of operator time spent in matrix multiplications, and the top operators."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import DynamicCache

    ids = torch.randint(100, min(lm.facts.vocab, 30000), (1, context), device=lm.device,
                        generator=torch.Generator().manual_seed(0)) if lm.device.type == "cpu" else \
        torch.randint(100, min(lm.facts.vocab, 30000), (1, context)).to(lm.device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if lm.device.type == "cuda" else [])
    with lm.lock, torch.inference_mode():
        cache = DynamicCache(config=lm.model.config)
        lm.model(input_ids=ids, past_key_values=cache, use_cache=True)
        nxt = ids[:, -1:]
        lm.model(input_ids=nxt, past_key_values=cache, use_cache=True)      # warm the step
        _sync(lm.device)
        plain = []
        for _ in range(5):                                                  # the step's time without the profiler
            t = time.perf_counter()
            lm.model(input_ids=nxt, past_key_values=cache, use_cache=True)
            _sync(lm.device)
            plain.append(time.perf_counter() - t)
        with profile(activities=acts) as prof:
            lm.model(input_ids=nxt, past_key_values=cache, use_cache=True)
            _sync(lm.device)
    use_cuda = lm.device.type == "cuda"
    rows = []
    for e in prof.key_averages():
        t = (getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)) if use_cuda \
            else e.self_cpu_time_total
        if t > 0:
            rows.append((e.key, t, e.count))
    total = sum(t for _, t, _ in rows) or 1
    mm = sum(t for k, t, _ in rows if k in MATMUL_OPS)
    rows.sort(key=lambda r: -r[1])
    plain.sort()
    return {"device_time": "GPU kernel time" if use_cuda else "CPU operator self time", "total_us": total,
            "step_ms": plain[len(plain) // 2] * 1000,
            "matmul_us": mm, "matmul_share": mm / total,
            "top": [{"op": k, "us": t, "calls": c, "share": t / total, "matmul": k in MATMUL_OPS}
                    for k, t, c in rows[:12]]}
