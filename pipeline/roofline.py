"""Roofline for one layer of the loaded model on this device, prefill and decode.

FLOPs and bytes moved per operation are COUNTED from the shapes (a multiply-add is 2 FLOPs; bytes are the
weights plus the activations read and written, at the model's dtype; attention scores in fp32 as eager
attention keeps them). Each operation is also TIMED on this device with the layer's real weights and
same-shape inputs, and the device's peak matmul FLOP/s and copy bandwidth are MEASURED by probes, not taken
from a table. The bound an operation cannot beat is max(FLOPs / peak, bytes / bandwidth).
"""
from __future__ import annotations

import time

import torch

from .hardware import matmul_probe
from .models import LoadedModel


def copy_bandwidth(device: torch.device, mb: int | None = None, reps: int = 5) -> dict:
    """Bytes per second of a large tensor copy (read + write counted), best of reps."""
    mb = mb or (1024 if device.type == "cuda" else 256)
    n = mb * 2**20 // 4
    a = torch.empty(n, device=device, dtype=torch.float32).fill_(1.0)
    b = torch.empty_like(a)
    b.copy_(a)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    best = float("inf")
    for _ in range(reps):
        sync()
        t = time.perf_counter()
        b.copy_(a)
        sync()
        best = min(best, time.perf_counter() - t)
    return {"mb": mb, "seconds": best, "bytes_per_s": 2 * n * 4 / best}


def layer_ops(lm: LoadedModel, tokens: int, context: int) -> list[dict]:
    """Count FLOPs and bytes of one layer's operations for `tokens` new tokens attending over `context`
    tokens (prefill: tokens = context = T; decode: tokens = 1, context = C), plus the LM head for one token."""
    f = lm.facts
    b = torch.tensor([], dtype=lm.dtype).element_size()
    d, H, Hkv, D, ff, V = f.d_model, f.n_heads, f.n_kv_heads, f.head_dim, f.d_ff, f.vocab
    T, C = tokens, context

    def lin(name, n_in, n_out):
        return {"op": name, "flops": 2 * T * n_in * n_out, "bytes": (n_in * n_out + T * n_in + T * n_out) * b}

    return [
        {"op": "norm (attention)", "flops": 4 * T * d, "bytes": (2 * T * d + d) * b},
        lin("q projection", d, H * D),
        lin("k projection", d, Hkv * D),
        lin("v projection", d, Hkv * D),
        {"op": "scores Q·Kᵀ", "flops": 2 * H * T * C * D, "bytes": (H * T * D + Hkv * C * D) * b + H * T * C * 4},
        {"op": "softmax", "flops": 5 * H * T * C, "bytes": 2 * H * T * C * 4},
        {"op": "weights × V", "flops": 2 * H * T * C * D, "bytes": H * T * C * 4 + (Hkv * C * D + H * T * D) * b},
        lin("o projection", H * D, d),
        {"op": "norm (feed-forward)", "flops": 4 * T * d, "bytes": (2 * T * d + d) * b},
        {"op": "feed-forward gate + up", "flops": 2 * 2 * T * d * ff, "bytes": (2 * d * ff + T * d + 2 * T * ff) * b},
        {"op": "feed-forward down", "flops": 2 * T * ff * d, "bytes": (ff * d + T * ff + T * d) * b},
        {"op": "LM head (1 token)", "flops": 2 * d * V, "bytes": (d * V + d + V) * b},
    ]


def _timed(fn, sync, reps=5):
    fn()
    sync()
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t)
    return best


def time_layer_ops(lm: LoadedModel, tokens: int, context: int, layer: int = 0) -> dict[str, float]:
    """Time each counted operation on this device with the layer's real weights (best of 5)."""
    f = lm.facts
    dev, dt = lm.device, lm.dtype
    base = lm.model.get_decoder() if hasattr(lm.model, "get_decoder") else lm.model.model
    lyr = base.layers[layer]
    att, mlp = lyr.self_attn, lyr.mlp
    sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(1, tokens, f.d_model, generator=g).to(dev, dt)
    q = torch.randn(1, f.n_heads, tokens, f.head_dim, generator=g).to(dev, dt)
    k = torch.randn(1, f.n_heads, context, f.head_dim, generator=g).to(dev, dt)    # after repeat_kv
    s = torch.randn(1, f.n_heads, tokens, context, generator=g).to(dev, torch.float32)
    w = torch.softmax(s, -1)
    h = torch.randn(1, tokens, f.d_ff, generator=g).to(dev, dt)
    a = torch.randn(1, tokens, f.n_heads * f.head_dim, generator=g).to(dev, dt)
    last = x[:, -1:]
    head = lm.model.get_output_embeddings()
    out = {}
    with torch.inference_mode():
        out["norm (attention)"] = _timed(lambda: lyr.input_layernorm(x), sync)
        out["q projection"] = _timed(lambda: att.q_proj(x), sync)
        out["k projection"] = _timed(lambda: att.k_proj(x), sync)
        out["v projection"] = _timed(lambda: att.v_proj(x), sync)
        out["scores Q·Kᵀ"] = _timed(lambda: torch.matmul(q, k.transpose(2, 3)), sync)
        out["softmax"] = _timed(lambda: torch.softmax(s, -1), sync)
        out["weights × V"] = _timed(lambda: torch.matmul(w.to(dt), k), sync)
        out["o projection"] = _timed(lambda: att.o_proj(a), sync)
        norm2 = getattr(lyr, "pre_feedforward_layernorm", None) or lyr.post_attention_layernorm
        out["norm (feed-forward)"] = _timed(lambda: norm2(x), sync)
        out["feed-forward gate + up"] = _timed(lambda: (mlp.gate_proj(x), mlp.up_proj(x)), sync)
        out["feed-forward down"] = _timed(lambda: mlp.down_proj(h), sync)
        out["LM head (1 token)"] = _timed(lambda: head(last), sync)
    return out


def roofline(lm: LoadedModel, prompt_tokens: int = 512, context: int = 512) -> dict:
    """Everything page 10 draws: device peaks (measured), per-op counts, bounds and measured times for prefill
    (prompt_tokens) and decode (1 token over `context`), and the batch-1 decode ceiling."""
    mm = matmul_probe(lm.device, lm.dtype)
    bw = copy_bandwidth(lm.device)
    peak, bandwidth = mm["tflops"] * 1e12, bw["bytes_per_s"]
    res = {"peak_flops": peak, "bandwidth": bandwidth, "ridge": peak / bandwidth, "matmul_probe": mm,
           "copy_probe": bw, "phases": {}}
    for phase, T, C in (("prefill", prompt_tokens, prompt_tokens), ("decode", 1, context)):
        ops = layer_ops(lm, T, C)
        times = time_layer_ops(lm, T, C)
        for o in ops:
            o["intensity"] = o["flops"] / o["bytes"]
            o["bound_s"] = max(o["flops"] / peak, o["bytes"] / bandwidth)
            o["bound_by"] = "compute" if o["flops"] / peak > o["bytes"] / bandwidth else "memory"
            o["measured_s"] = times[o["op"]]
        res["phases"][phase] = {"tokens": T, "context": C, "ops": ops}
    b = torch.tensor([], dtype=lm.dtype).element_size()
    weight_bytes = lm.facts.n_params * b
    from .generate import kv_bytes_formula
    kv = kv_bytes_formula(lm, context)
    res["decode_ceiling_tokens_per_s"] = bandwidth / (weight_bytes + kv)
    res["weight_bytes"], res["kv_bytes"] = weight_bytes, kv
    return res
