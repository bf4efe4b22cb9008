"""Streaming and sharding: the event stream a server sends, and a plan for splitting the model over N devices.

The sharding plan is COMPUTED FROM THE CONFIG (parameter shapes), not measured: this machine has at most one
accelerator. Pipeline split: contiguous layers per device, balanced by weight bytes, embeddings on the first,
final norm and LM head on the last (the goal of accelerate's device_map="balanced"). Tensor parallel (Megatron-style): query/key/value and
gate/up projections split by output columns (heads stay whole), output and down projections split by input
rows, so each layer needs two all-reduces of the token's d_model activations.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from pipeline.model.loaded import LoadedModel


def sse_lines(events) -> list[str]:
    """The generation events as a text/event-stream body, one `data:` message per token (what a streaming
    HTTP API sends; OpenAI-style servers do the same)."""
    out = []
    for e in events:
        payload = {"index": e.index, "phase": e.phase, "token": e.token_id, "text": e.text, "t_ms": round(e.t_s * 1000, 1), "finished": e.finished}
        out.append(f"event: token\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n")
    out.append("event: done\ndata: [DONE]\n\n")
    return out


def _params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def _balanced_split(sizes: list[int], first: int, last: int, n: int) -> list[int]:
    """Layer counts per device for a contiguous split that makes the heaviest device as light as possible,
    `first` and `last` bytes (embeddings; final norm and LM head) riding on the first and last device. Exact:
    dynamic programming over cut points (L <= a few hundred layers, N <= 8)."""
    L = len(sizes)
    pre = [0]
    for x in sizes:
        pre.append(pre[-1] + x)

    def load(a, b, dev):  # device `dev` holds layers a..b-1
        return pre[b] - pre[a] + (first if dev == 0 else 0) + (last if dev == n - 1 else 0)

    INF = float("inf")
    best = [[INF] * (L + 1) for _ in range(n + 1)]  # best[d][b]: first d devices hold layers 0..b-1
    cut = [[0] * (L + 1) for _ in range(n + 1)]
    best[0][0] = 0
    for d in range(1, n + 1):
        for b in range(L + 1):
            for a in range(b + 1):
                v = max(best[d - 1][a], load(a, b, d - 1))
                if v < best[d][b]:
                    best[d][b], cut[d][b] = v, a
    counts, b = [], L
    for d in range(n, 0, -1):
        a = cut[d][b]
        counts.append(b - a)
        b = a
    return counts[::-1]


@dataclass
class PipelineStage:
    """One device of a pipeline-parallel plan (computed from parameter shapes: a plan, not a measurement)."""

    device: int
    layers: str  # "0–9", or "—" for none
    n_layers: int
    also: str  # embeddings / final norm + LM head held besides the layers
    weights_mb: float  # MiB of weights on this device


@dataclass
class TensorParallelPlan:
    """How one layer's matrices split over N devices (a plan from the config)."""

    rows: list[dict]  # per weight: shape, how it splits, what each device holds (a table)
    allreduce_bytes_per_token: int  # activations all-reduced per token (2 per layer x d_model x bytes)
    ring_bytes_sent_per_device_per_token: float
    kv_cache_bytes_per_token_per_device: int  # on the busiest device
    kv_heads_on_busiest_device: int
    weights_mb_per_device: float
    issues: list[str]  # uneven splits


def pipeline_plan(lm: LoadedModel, n_devices: int) -> list[PipelineStage]:
    """Contiguous layers per device, balanced by the bytes of weights each device holds (the goal of
    accelerate's device_map="balanced"; its own placement may differ by a layer), with the embeddings on the
    first device and the final norm and LM head on the last. A plan, from the model's parameter shapes."""
    layers, bpv = lm.arch.layers, lm.arch.bytes_per_value
    N = max(1, n_devices)
    emb = _params(lm.arch.embed()) + (_params(lm.arch.pos_embed()) if lm.arch.pos_embed() is not None else 0)
    head = 0 if lm.facts.tied_embeddings else _params(lm.arch.unembedding())
    per_layer = [_params(layer) for layer in layers]
    final = _params(lm.arch.final_norm_module())
    counts = _balanced_split(per_layer, emb, final + head, N)
    plan, start = [], 0
    for i, n in enumerate(counts):
        p = sum(per_layer[start : start + n])
        extra = []
        if i == 0:
            p += emb
            extra.append("embeddings")
        if i == N - 1:
            p += final + head
            extra.append("final norm + LM head" + (" (tied: reads device 0's embedding)" if head == 0 else ""))
        plan.append(PipelineStage(i, f"{start}–{start + n - 1}" if n else "—", n, ", ".join(extra), p * bpv / 2**20))
        start += n
    return plan


def _shares(total: int, n: int) -> str:
    """How `total` whole units (heads) spread over n devices: "3 each" or "5 on 1 device, 4 on 1"."""
    q, r = divmod(total, n)
    if r == 0:
        return f"{q} each"
    return f"{q + 1} on {r} device{'s' if r > 1 else ''}, {q} on {n - r} (uneven)"


def even_device_counts(lm: LoadedModel, choices=(2, 3, 4, 8)) -> list[int]:
    """Device counts that split the query heads evenly and the KV heads evenly (or replicate them evenly)."""
    H, Hkv = lm.facts.n_heads, lm.facts.n_kv_heads
    return [n for n in choices if H % n == 0 and (Hkv % n == 0 or n % Hkv == 0)]


def tensor_parallel_plan(lm: LoadedModel, n_devices: int) -> TensorParallelPlan:
    """How each projection of a layer splits over N devices, KV heads per device, and communication. Heads
    stay whole: with N not dividing them, some devices hold one more (the busiest device is what counts)."""
    f, N = lm.facts, max(1, n_devices)
    bpv = lm.arch.bytes_per_value
    d, D, H, Hkv, ff = f.d_model, f.head_dim, f.n_heads, f.n_kv_heads, f.d_ff
    kv_max = -(-Hkv // N) if Hkv >= N else 1  # KV heads on the busiest device
    rows = [
        {"weight": "query projection (W_Q)", "shape": f"{d} × {H * D}", "split": "columns (by query head)", "per device": f"query heads: {_shares(H, N)}"},
        {
            "weight": "key, value projections (W_K, W_V)",
            "shape": f"{d} × {Hkv * D}",
            "split": "columns (by KV head)" if Hkv >= N else f"replicated: {Hkv} KV heads < {N} devices",
            "per device": f"KV heads: {_shares(Hkv, N)}"
            if Hkv >= N
            else f"1 KV head (each copied to {N // Hkv} devices)"
            if N % Hkv == 0
            else "1 KV head (copied unevenly)",
        },
        {"weight": "output projection (W_O)", "shape": f"{H * D} × {d}", "split": "rows → all-reduce", "per device": f"rows of its query heads ({D} per head)"},
        {"weight": "gate, up projections", "shape": f"{d} × {ff}", "split": "columns", "per device": f"columns: {_shares(ff, N)}"},
        {"weight": "down projection", "shape": f"{ff} × {d}", "split": "rows → all-reduce", "per device": f"rows: {_shares(ff, N)}"},
    ]
    allreduce = 2 * f.n_layers * d * bpv if N > 1 else 0  # bytes of activations reduced per token (one device: nothing to reduce)
    ring = allreduce * 2 * (N - 1) / N  # bytes each device sends per token (ring)
    issues = []
    if H % N:
        issues.append(f"{H} query heads do not divide by {N}: some devices hold one more head and set the pace.")
    uneven_kv = (N % Hkv != 0) if Hkv < N else (Hkv % N != 0)
    if uneven_kv:
        issues.append(f"{Hkv} KV heads and {N} devices do not divide: uneven KV split.")
    kv_per_token = 2 * f.n_layers * kv_max * D * bpv
    return TensorParallelPlan(rows, allreduce, ring, kv_per_token, kv_max, f.n_params * bpv / N / 2**20, issues)


def devices_present() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
