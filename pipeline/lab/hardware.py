"""Why a GPU: measured matmul throughput of this device, and where a decode step's time goes."""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from pipeline.common.timing import Samples, best_of, ids_of_length, sync
from pipeline.model.loaded import LoadedModel

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
    seconds: float  # the median of the repeats (s)
    tflops: float  # 2 n^3 / seconds / 1e12
    runs: Samples = None  # every repeat (s)


@dataclass
class OpShare:
    op: str  # the torch operator
    us: float  # its self time in a profiled step (µs), the median over the repeats
    calls: int
    share: float  # of the step's operator time (0-1), the median over the repeats
    matmul: bool  # a matrix multiplication
    lo: float = 0.0  # the lowest and highest share over the repeats
    hi: float = 0.0


@dataclass
class DecodeProfile:
    """Decode steps under torch.profiler, each repeat profiled on its own, interleaved with plain timings."""

    device_time: str  # what the times are: GPU kernel time or CPU operator self time
    total_us: float  # all operators' self time (µs), the median repeat's
    step_ms: float  # the step without the profiler, median of the repeats (ms)
    matmul_us: float  # the matmul operators' self time of the same (median) repeat
    matmul_share: float  # matmul_us / total_us
    top: list[OpShare]  # the 12 costliest operators (median shares)
    shares: Samples = None  # the matmul share in every repeat
    steps: Samples = None  # the plain step time in every repeat (s)

    @property
    def noisy(self) -> str | None:
        """Why the shares cannot be read as a finding (repeats that disagree), or None."""
        if self.shares is None or len(self.shares.values) < 3:
            return "fewer than 3 profiled repeats"
        wide = [o for o in self.top if o.hi - o.lo > 0.15]
        if self.shares.hi - self.shares.lo > 0.15 or wide:
            which = f"{wide[0].op}: {wide[0].lo:.0%}–{wide[0].hi:.0%}" if wide else f"matmul share {self.shares.lo:.0%}–{self.shares.hi:.0%}"
            return f"the repeats disagree by more than 15 points ({which})"
        return None


def matmul_probe(device: torch.device, dtype: torch.dtype, n: int | None = None, reps: int = 5) -> MatmulProbe:
    """Time an n x n x n matmul on this device: {n, seconds, tflops} (the median of reps after a warm-up, every
    repeat kept)."""
    n = n or (8192 if device.type == "cuda" else 1024)
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    a @ b
    runs = Samples(tuple(best_of(lambda: a @ b, device, 1, warmup=False) for _ in range(reps)))
    return MatmulProbe(n, str(dtype).removeprefix("torch."), runs.median, 2 * n**3 / runs.median / 1e12, runs)


def _profiled_steps(lm: LoadedModel, context: int, repeats: int) -> tuple[list[dict[str, tuple[float, int]]], list[float]]:
    """`repeats` decode steps over a `context`-token cache, each timed plainly and then profiled: per repeat
    {operator: (self time µs, calls)} (a GPU's kernel time, a CPU's operator self time), and the plain seconds."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import DynamicCache

    ids = ids_of_length(lm, context)
    use_cuda = lm.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda else [])
    per_rep: list[dict[str, tuple[float, int]]] = []
    plain = []
    with lm.lock, torch.inference_mode():
        cache = DynamicCache(config=lm.model.config)
        lm.model(input_ids=ids, past_key_values=cache, use_cache=True)
        nxt = ids[:, -1:]
        lm.model(input_ids=nxt, past_key_values=cache, use_cache=True)  # warm the step
        sync(lm.device)
        for _ in range(repeats):
            t = time.perf_counter()
            lm.model(input_ids=nxt, past_key_values=cache, use_cache=True)
            sync(lm.device)
            plain.append(time.perf_counter() - t)
            with profile(activities=acts) as prof:
                lm.model(input_ids=nxt, past_key_values=cache, use_cache=True)
                sync(lm.device)
            ops = {}
            for e in prof.key_averages():
                us = (getattr(e, "self_device_time_total", 0) or getattr(e, "self_cuda_time_total", 0)) if use_cuda else e.self_cpu_time_total
                if us > 0:
                    ops[e.key] = (us, e.count)
            per_rep.append(ops)
    return per_rep, plain


def decode_step_profile(lm: LoadedModel, context: int = 64, repeats: int = 5) -> DecodeProfile:
    """Profile decode steps (a single new token over a `context`-token KV cache) with torch.profiler, `repeats`
    times, each profiled step next to a plain timing of the same step. Returns the median share of operator time
    spent in matrix multiplications with its range, and the top operators by median share. One profiled step
    alone is a sample, not a finding: on a busy machine one operator can seem to take most of it."""
    import statistics

    per_rep, plain = _profiled_steps(lm, context, repeats)
    totals = [sum(us for us, _ in ops.values()) or 1 for ops in per_rep]
    mm = [sum(us for k, (us, _) in ops.items() if k in MATMUL_OPS) for ops in per_rep]
    shares = [m / t for m, t in zip(mm, totals)]
    mid = sorted(range(repeats), key=lambda i: shares[i])[repeats // 2]  # the median repeat, for the absolute figures
    names = {k for ops in per_rep for k in ops}
    top = []
    for k in names:
        sh = [ops.get(k, (0.0, 0))[0] / t for ops, t in zip(per_rep, totals)]
        top.append(
            OpShare(
                k,
                statistics.median(ops.get(k, (0.0, 0))[0] for ops in per_rep),
                per_rep[mid].get(k, (0, 0))[1],
                statistics.median(sh),
                k in MATMUL_OPS,
                min(sh),
                max(sh),
            )
        )
    top.sort(key=lambda o: -o.share)
    return DecodeProfile(
        "GPU kernel time" if lm.device.type == "cuda" else "CPU operator self time",
        totals[mid],
        statistics.median(plain) * 1000,
        mm[mid],
        shares[mid],
        top[:12],
        Samples(tuple(shares)),
        Samples(tuple(plain)),
    )
