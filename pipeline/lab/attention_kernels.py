"""Attention kernels, measured: eager attention (materialises the T x T score matrix in every layer) vs
PyTorch SDPA with each backend this device offers (math, memory-efficient, flash, cuDNN). Whole-model prefill
time and peak memory over prompt lengths, and a check that every kernel gives the same logits."""

from __future__ import annotations

import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from pipeline.common.telemetry import PeakMemory
from pipeline.common.timing import Samples, ids_of_length, syncer
from pipeline.model.loaded import LoadedModel

BACKENDS = {
    "sdpa: math": SDPBackend.MATH,
    "sdpa: flash": SDPBackend.FLASH_ATTENTION,
    "sdpa: memory-efficient": SDPBackend.EFFICIENT_ATTENTION,
    "sdpa: cuDNN": SDPBackend.CUDNN_ATTENTION,
}


def available_kernels(lm: LoadedModel) -> list[str]:
    """Kernels that run on this device for this model's attention shape (tried on a tiny input)."""
    out = ["eager"]
    f = lm.facts
    q = torch.randn(1, f.n_heads, 8, f.head_dim, device=lm.device, dtype=lm.dtype)
    for name, backend in BACKENDS.items():
        try:
            with sdpa_kernel([backend]):
                torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
            out.append(name)
        except RuntimeError:
            pass
    return out


def score_matrix_mb(lm: LoadedModel, tokens: int) -> float:
    """What eager attention materialises per layer: heads x T x T scores (fp32 softmax) - the O(T^2) term."""
    return lm.facts.n_heads * tokens * tokens * 4 / 2**20


@dataclass
class KernelRun:
    """One attention kernel at one prompt length: a whole-model prefill."""

    kernel: str  # "eager" or "sdpa: <backend>"
    tokens: int  # prompt length T
    seconds: float | None  # the median of the repeats after a warm-up (s); None when it could not run
    peak_mb: float | None  # peak extra memory of a third, untimed run (MiB)
    score_matrix_mb: float  # one layer's H x T x T fp32 scores, what eager materialises (MiB)
    max_diff_vs_eager: float | None  # max |logit difference| from the eager kernel
    memory_method: str = ""  # how peak_mb was measured
    error: str = ""  # why it did not run
    runs: Samples | None = None  # every repeat's prefill time (s)


def kernel_sweep(lm: LoadedModel, lengths: list[int], kernels: list[str] | None = None, progress=None, repeats: int = 3) -> list[KernelRun]:
    """Prefill (one forward of T tokens) per kernel and length: `repeats` interleaved timings (each repeat times
    every kernel at every length, in a rotated order, so a busy moment spoils one repeat of several points
    instead of every repeat of one), peak extra memory (an untimed run, see telemetry.PeakMemory), and max
    |logit difference| from the eager kernel. The model lock is held for one run at a time, the attention
    implementation restored before it is released: other visitors' traces and generations run in between."""
    kernels = kernels or available_kernels(lm)
    jobs = [(n, k) for n in lengths for k in kernels]
    ids = {n: ids_of_length(lm, n) for n in lengths}
    times: dict[tuple[int, str], list[float]] = {j: [] for j in jobs}
    info: dict[tuple[int, str], tuple] = {}
    errors: dict[tuple[int, str], str] = {}
    total, done = len(jobs) * repeats, 0

    @contextmanager
    def kernel(k):
        with lm.lock:
            with lm.arch.attention_as("eager" if k == "eager" else "sdpa"), torch.inference_mode():
                with nullcontext() if k == "eager" else sdpa_kernel([BACKENDS[k]]):
                    yield

    sync = syncer(lm.device)
    for r in range(repeats):
        order = jobs[r % len(jobs) :] + jobs[: r % len(jobs)]
        for n, k in order:
            if (n, k) not in errors:
                try:
                    with kernel(k):
                        if r == 0:  # warm-up, logits and peak memory once, untimed
                            lm.model(input_ids=ids[n][:, :8], use_cache=False)
                            out = lm.model(input_ids=ids[n], use_cache=False, logits_to_keep=1)
                            with PeakMemory(lm.device) as pm:
                                lm.model(input_ids=ids[n], use_cache=False, logits_to_keep=1)
                            info[(n, k)] = (out.logits[0, -1].float().cpu(), pm.extra_mb, pm.method)
                        sync()
                        t = time.perf_counter()
                        lm.model(input_ids=ids[n], use_cache=False, logits_to_keep=1)
                        sync()
                        times[(n, k)].append(time.perf_counter() - t)
                except RuntimeError as e:  # out of memory or unsupported at this size
                    errors[(n, k)] = str(e).splitlines()[0][:200]
            done += 1
            if progress:
                progress(done / total, f"repeat {r + 1} of {repeats}: {k}, {n} tokens")
    rows = []
    for n, k in jobs:
        if (n, k) in errors or not times[(n, k)]:
            rows.append(KernelRun(k, n, None, None, score_matrix_mb(lm, n), None, error=errors.get((n, k), "not measured")))
            continue
        logits, peak, method = info[(n, k)]
        ref = info.get((n, "eager"), (None,))[0]
        diff = float((logits - ref).abs().max()) if ref is not None else None
        runs = Samples(tuple(times[(n, k)]))
        rows.append(KernelRun(k, n, runs.median, peak, score_matrix_mb(lm, n), diff, method, runs=runs))
    return rows


def sweep_doubts(rows: list[KernelRun]) -> list[str]:
    """Where the repeats contradict what a prefill must do: a kernel whose longer prompt was measured faster than
    a shorter one in every repeat (more tokens are never less work), or repeats that span more than 2x. Each is
    said on the page as noise, never drawn as a finding."""
    out = []
    for k in dict.fromkeys(r.kernel for r in rows):
        rs = sorted((r for r in rows if r.kernel == k and r.runs is not None), key=lambda r: r.tokens)
        for a, b in zip(rs, rs[1:]):
            if a.runs.above(b.runs):
                out.append(f"{k}: {b.tokens:,} tokens measured faster than {a.tokens:,} in every repeat ({b.runs.fmt(1, 's', 2)} vs {a.runs.fmt(1, 's', 2)})")
        out += [
            f"{k} at {r.tokens:,} tokens: repeats from {r.runs.lo:.2f} to {r.runs.hi:.2f} s" for r in rs if len(r.runs.values) > 1 and r.runs.hi > 2 * r.runs.lo
        ]
    return out
