"""Streaming and sharding: the event stream a server sends, and a plan for splitting the model over N devices.

The sharding plan is COMPUTED FROM THE CONFIG (parameter shapes), not measured: this machine has at most one
accelerator. Pipeline split: contiguous layers per device, embeddings on the first, final norm and LM head on
the last (what accelerate's device_map="balanced" does). Tensor parallel (Megatron-style): query/key/value and
gate/up projections split by output columns (heads stay whole), output and down projections split by input
rows, so each layer needs two all-reduces of the token's d_model activations.
"""
from __future__ import annotations

import json

import torch

from .models import LoadedModel


def sse_lines(events) -> list[str]:
    """The generation events as a text/event-stream body, one `data:` message per token (what a streaming
    HTTP API sends; OpenAI-style servers do the same)."""
    out = []
    for e in events:
        payload = {"index": e.index, "phase": e.phase, "token": e.token_id, "text": e.text,
                   "t_ms": round(e.t_s * 1000, 1), "finished": e.finished}
        out.append(f"event: token\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n")
    out.append("event: done\ndata: [DONE]\n\n")
    return out


def _params(module) -> int:
    return sum(p.numel() for p in module.parameters())


def pipeline_plan(lm: LoadedModel, n_devices: int) -> list[dict]:
    """Layers per device and the bytes of weights each holds (plan, from the model's own parameter shapes)."""
    model = lm.model
    base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    layers = list(base.layers)
    bpv = torch.tensor([], dtype=lm.dtype).element_size()
    L, N = len(layers), max(1, n_devices)
    sizes = [L // N + (1 if i < L % N else 0) for i in range(N)]
    plan, start = [], 0
    emb = _params(base.embed_tokens)
    head = 0 if lm.facts.tied_embeddings else _params(model.get_output_embeddings())
    for i, n in enumerate(sizes):
        p = sum(_params(layer) for layer in layers[start:start + n])
        extra = []
        if i == 0:
            p += emb
            extra.append("embeddings")
        if i == N - 1:
            p += _params(base.norm) + head
            extra.append("final norm + LM head" + (" (tied: reads device 0's embedding)" if head == 0 else ""))
        plan.append({"device": i, "layers": f"{start}–{start + n - 1}" if n else "—", "n_layers": n,
                     "also": ", ".join(extra), "weights_mb": p * bpv / 2**20})
        start += n
    return plan


def tensor_parallel_plan(lm: LoadedModel, n_devices: int) -> dict:
    """How each projection of a layer splits over N devices, KV heads per device, and communication."""
    f, N = lm.facts, max(1, n_devices)
    bpv = torch.tensor([], dtype=lm.dtype).element_size()
    d, D, H, Hkv, ff = f.d_model, f.head_dim, f.n_heads, f.n_kv_heads, f.d_ff
    rows = [
        {"weight": "q_proj", "shape": f"{d} × {H * D}", "split": "columns (by query head)",
         "per device": f"{H / N:g} query heads"},
        {"weight": "k_proj, v_proj", "shape": f"{d} × {Hkv * D}", "split": "columns (by KV head)"
         if Hkv >= N else f"replicated: {Hkv} KV heads < {N} devices",
         "per device": f"{Hkv / N:g} KV heads" if Hkv >= N else f"1 KV head copy (shared by {N // max(1, Hkv)} devices)"},
        {"weight": "o_proj", "shape": f"{H * D} × {d}", "split": "rows → all-reduce", "per device": f"{H * D // N} rows"},
        {"weight": "gate_proj, up_proj", "shape": f"{d} × {ff}", "split": "columns", "per device": f"{ff / N:g} columns"},
        {"weight": "down_proj", "shape": f"{ff} × {d}", "split": "rows → all-reduce", "per device": f"{ff / N:g} rows"},
    ]
    allreduce = 2 * f.n_layers * d * bpv                          # bytes of activations reduced per token
    ring = allreduce * 2 * (N - 1) / N                            # bytes each device sends per token (ring)
    issues = []
    if H % N:
        issues.append(f"{H} query heads do not divide by {N}: heads cannot be split evenly.")
    uneven_kv = (N % Hkv != 0) if Hkv < N else (Hkv % N != 0)
    if uneven_kv:
        issues.append(f"{Hkv} KV heads and {N} devices do not divide: uneven KV split.")
    kv_per_token = 2 * f.n_layers * (max(1, Hkv // N) if Hkv >= N else 1) * D * bpv
    return {"rows": rows, "allreduce_bytes_per_token": allreduce, "ring_bytes_sent_per_device_per_token": ring,
            "kv_cache_bytes_per_token_per_device": kv_per_token, "weights_mb_per_device":
            f.n_params * bpv / N / 2**20, "issues": issues}


def devices_present() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
