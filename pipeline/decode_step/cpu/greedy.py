"""A step's greedy summary (the argmax, the log-sum-exp, the top k) of CPU logits in one C call: cpu_decode.c's
greedy_summary, one thread, where torch's three reductions each woke the OpenMP team."""

from __future__ import annotations

import numpy as np
import torch

from pipeline.decode_step.choice import CHOICE
from pipeline.decode_step.cpu.library import dim, ptr
from pipeline.forward.sampling import GreedySummary


def greedy_summary(logits: torch.Tensor, k: int) -> GreedySummary:
    """GreedySummary.of(logits, k) for float32 logits [V] or [rows, V] on a CPU, in one C call where
    pipeline.decode_step.choice says it serves (CHOICE.greedy); torch's elsewhere and inside torch.compile (a traced
    step has no call out to C)."""
    if not CHOICE.greedy(logits).c:
        return GreedySummary.of(logits, k)
    lib = CHOICE.library()
    x = np.ascontiguousarray(logits.detach().numpy().reshape(-1, logits.shape[-1]))
    rows, V = x.shape
    k = min(int(k), V)
    am, lse = np.empty(rows, dtype=np.int64), np.empty(rows, dtype=np.float32)
    vals, ids = np.empty((rows, k), dtype=np.float32), np.empty((rows, k), dtype=np.int64)
    if rows:
        lib.greedy_summary(ptr(x), dim(rows, "logits rows"), dim(V, "vocabulary"), dim(k, "k"), ptr(am), ptr(lse), ptr(vals), ptr(ids))
    out = GreedySummary(*(torch.from_numpy(a) for a in (am, lse, vals, ids)))
    return out if logits.ndim == 2 else out.row(0)
