"""Attention kernels, measured: eager attention (materialises the T x T score matrix in every layer) vs
PyTorch SDPA with each backend this device offers (math, memory-efficient, flash, cuDNN). Whole-model prefill
time and peak memory over prompt lengths, and a check that every kernel gives the same logits."""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from .models import LoadedModel
from .telemetry import PeakMemory
from .timing import best_of, ids_of_length

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
    seconds: float | None  # best of 2 after a warm-up (s); None when it could not run
    peak_mb: float | None  # peak extra memory of a third, untimed run (MiB)
    score_matrix_mb: float  # one layer's H x T x T fp32 scores, what eager materialises (MiB)
    max_diff_vs_eager: float | None  # max |logit difference| from the eager kernel
    memory_method: str = ""  # how peak_mb was measured
    error: str = ""  # why it did not run


def kernel_sweep(lm: LoadedModel, lengths: list[int], kernels: list[str] | None = None, progress=None) -> list[KernelRun]:
    """Prefill (one forward of T tokens) per kernel and length: seconds (best of 2 after a warm-up), peak extra
    memory (a third run, see telemetry.PeakMemory), and max |logit difference| from the eager kernel."""
    kernels = kernels or available_kernels(lm)
    rows, total, done = [], len(lengths) * len(kernels), 0
    for n in lengths:
        ids = ids_of_length(lm, n)
        ref = None
        for k in kernels:
            # the model lock for one (length, kernel) at a time, the attention implementation restored before it
            # is released: other visitors' traces and generations run between the measurements
            with lm.lock:
                impl = lm.model.config._attn_implementation
                lm.model.set_attn_implementation("eager" if k == "eager" else "sdpa")
                ctx = (lambda: nullcontext()) if k == "eager" else (lambda: sdpa_kernel([BACKENDS[k]]))
                try:
                    with torch.inference_mode(), ctx():
                        lm.model(input_ids=ids[:, :8], use_cache=False)  # warm-up
                        last = {}
                        best = best_of(lambda: last.update(out=lm.model(input_ids=ids, use_cache=False, logits_to_keep=1)), lm.device, reps=2, warmup=False)
                        out = last["out"]
                        with PeakMemory(lm.device) as pm:  # a third, untimed run
                            lm.model(input_ids=ids, use_cache=False, logits_to_keep=1)
                        peak = pm.extra_mb
                    logits = out.logits[0, -1].float().cpu()
                    ref = logits if k == "eager" else ref
                    diff = float((logits - ref).abs().max()) if ref is not None else None
                    rows.append(KernelRun(k, n, best, peak, score_matrix_mb(lm, n), diff, pm.method))
                except RuntimeError as e:  # out of memory or unsupported at this size
                    rows.append(KernelRun(k, n, None, None, score_matrix_mb(lm, n), None, error=str(e).splitlines()[0][:200]))
                finally:
                    lm.model.set_attn_implementation(impl)
            done += 1
            if progress:
                progress(done / total, f"{k}, {n} tokens")
    return rows
