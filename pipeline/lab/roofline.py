"""Roofline for one layer of the loaded model on this device, prefill and decode.

FLOPs and bytes moved per operation are COUNTED from the shapes (a multiply-add is 2 FLOPs; bytes are the
weights plus the activations read and written, at the model's dtype; attention scores in fp32 as eager
attention keeps them). Each operation is also TIMED on this device with the layer's real weights and
same-shape inputs, and the device's peak matmul FLOP/s and copy bandwidth are MEASURED by probes, not taken
from a table. The bound an operation cannot beat is max(FLOPs / peak, bytes / bandwidth).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from pipeline.common.timing import Samples, best_of, interleaved
from pipeline.generation.events import Phase
from pipeline.generation.loop import kv_bytes_formula
from pipeline.lab.hardware import matmul_probe
from pipeline.model.loaded import LoadedModel


@dataclass
class CopyProbe:
    mb: int  # size of the copied (or read) buffer (MiB)
    seconds: float  # best of the repeats (s)
    bytes_per_s: float  # bytes moved per second (a copy: read + write counted)
    how: str = "a large tensor copy, read and write counted"


@dataclass
class OpCost:
    """One operation of a layer: counted from the shapes, bounded by the measured peaks, timed."""

    op: str
    flops: int  # FLOPs (a multiply-add is 2)
    bytes: int  # bytes moved: weights + activations read and written
    intensity: float = 0.0  # FLOPs per byte
    bound_s: float = 0.0  # max(FLOPs / peak, bytes / bandwidth) (s)
    bound_by: str = ""  # "compute" | "memory"
    measured_s: float = 0.0  # the median of 5 interleaved repeats on this device with the layer's real weights (s)
    measured: Samples | None = None  # every repeat (s)


@dataclass
class RooflinePhase:
    tokens: int  # new tokens (prefill: T; decode: 1)
    context: int  # tokens attended over
    ops: list[OpCost]


@dataclass(eq=False)
class Roofline:
    """Everything the roofline page draws: measured device peaks, and one layer's operations for prefill and decode."""

    peak_flops: float  # FLOP/s, measured by a matmul probe
    bandwidth: float  # bytes/s, measured by a large copy
    matmul_probe: object  # hardware.MatmulProbe
    copy_probe: CopyProbe
    phases: dict[Phase, RooflinePhase]  # Phase.PREFILL, Phase.DECODE
    decode_ceiling_tokens_per_s: float  # bandwidth / (weight bytes + KV bytes at the decode context)
    weight_bytes: int
    kv_bytes: int

    @property
    def ridge(self) -> float:
        """FLOPs per byte where the compute roof meets the bandwidth roof."""
        return self.peak_flops / self.bandwidth


def copy_bandwidth(device: torch.device, mb: int | None = None, reps: int = 5) -> CopyProbe:
    """Bytes per second of a large tensor copy (read + write counted), best of reps."""
    mb = mb or (1024 if device.type == "cuda" else 256)
    n = mb * 2**20 // 4
    a = torch.empty(n, device=device, dtype=torch.float32).fill_(1.0)
    b = torch.empty_like(a)
    best = best_of(lambda: b.copy_(a), device, reps)
    return CopyProbe(mb, best, 2 * n * 4 / best)


def layer_ops(lm: LoadedModel, tokens: int, context: int) -> list[OpCost]:
    """Count FLOPs and bytes of one layer's operations for `tokens` new tokens attending over `context`
    tokens (prefill: tokens = context = T; decode: tokens = 1, context = C), plus the LM head for one token."""
    f = lm.facts
    b = lm.arch.bytes_per_value
    d, H, Hkv, D, ff, V = f.d_model, f.n_heads, f.n_kv_heads, f.head_dim, f.d_ff, f.vocab
    T, C = tokens, context

    def lin(name, n_in, n_out):
        return OpCost(name, 2 * T * n_in * n_out, (n_in * n_out + T * n_in + T * n_out) * b)

    return [
        OpCost("norm (attention)", 4 * T * d, (2 * T * d + d) * b),
        lin("q projection", d, H * D),
        lin("k projection", d, Hkv * D),
        lin("v projection", d, Hkv * D),
        OpCost("scores Q·Kᵀ", 2 * H * T * C * D, (H * T * D + Hkv * C * D) * b + H * T * C * 4),
        OpCost("softmax", 5 * H * T * C, 2 * H * T * C * 4),
        OpCost("weights × V", 2 * H * T * C * D, H * T * C * 4 + (Hkv * C * D + H * T * D) * b),
        lin("o projection", H * D, d),
        OpCost("norm (feed-forward)", 4 * T * d, (2 * T * d + d) * b),
        OpCost("feed-forward gate + up", 2 * 2 * T * d * ff, (2 * d * ff + T * d + 2 * T * ff) * b),
        OpCost("feed-forward down", 2 * T * ff * d, (ff * d + T * ff + T * d) * b),
        OpCost("LM head (1 token)", 2 * d * V, (d * V + d + V) * b),
    ]


def time_layer_ops(lm: LoadedModel, tokens: int, context: int, layer: int = 0, repeats: int = 5) -> dict[str, Samples]:
    """Time each counted operation on this device with the layer's real weights: `repeats` interleaved repeats
    (each repeat times every operation once, in a rotated order) after a warm-up."""
    f = lm.facts
    dev, dt = lm.device, lm.dtype
    arch = lm.arch
    qkv, gate_up = arch.qkv_projs(layer), arch.gate_up_projs(layer)
    if qkv is None or gate_up is None or arch.in_norm(layer) is None:
        raise ValueError(
            f"Timing each operation takes a layer of the Llama layout (a norm, then separate q/k/v and gate/up projections); "
            f"this model ({arch.model_type}) fuses or reorders them, so this page measures Llama-layout models only for now."
        )
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(1, tokens, f.d_model, generator=g).to(dev, dt)
    q = torch.randn(1, f.n_heads, tokens, f.head_dim, generator=g).to(dev, dt)
    k = torch.randn(1, f.n_heads, context, f.head_dim, generator=g).to(dev, dt)  # after repeat_kv
    s = torch.randn(1, f.n_heads, tokens, context, generator=g).to(dev, torch.float32)
    w = torch.softmax(s, -1)
    h = torch.randn(1, tokens, f.d_ff, generator=g).to(dev, dt)
    a = torch.randn(1, tokens, f.n_heads * f.head_dim, generator=g).to(dev, dt)
    last = x[:, -1:]
    head = arch.unembedding()
    norm1, norm2 = arch.in_norm(layer), arch.pre_ffn_norm(layer)
    ops = {
        "norm (attention)": lambda: norm1(x),
        "q projection": lambda: qkv[0](x),
        "k projection": lambda: qkv[1](x),
        "v projection": lambda: qkv[2](x),
        "scores Q·Kᵀ": lambda: torch.matmul(q, k.transpose(2, 3)),
        "softmax": lambda: torch.softmax(s, -1),
        "weights × V": lambda: torch.matmul(w.to(dt), k),
        "o projection": lambda: arch.attn_out(layer)(a),
        "norm (feed-forward)": lambda: norm2(x),
        "feed-forward gate + up": lambda: (gate_up[0](x), gate_up[1](x)),
        "feed-forward down": lambda: arch.ffn_out(layer)(h),
        "LM head (1 token)": lambda: head(last),
    }
    with torch.inference_mode():
        for fn in ops.values():  # warm-up
            fn()
        return interleaved({name: (lambda fn=fn: best_of(fn, dev, 1, warmup=False)) for name, fn in ops.items()}, repeats)


def roofline(lm: LoadedModel, prompt_tokens: int = 512, context: int = 512) -> Roofline:
    """Everything the roofline page draws: device peaks (measured), per-op counts, bounds and measured times for prefill
    (prompt_tokens) and decode (1 token over `context`), and the batch-1 decode ceiling."""
    mm = matmul_probe(lm.device, lm.dtype)
    if lm.device.type == "cpu":  # the memory's read speed, streamed as fast as this CPU allows (a decode step reads)
        from pipeline.decode_step.cpu.bandwidth import read_probe

        rp = read_probe(min(lm.facts.n_params * lm.arch.bytes_per_value, 1 << 30))
        bw = CopyProbe(rp.bytes >> 20, rp.seconds, rp.gb_per_s * 1e9, f"a read as large as the weights ({rp.kernel}, best of {rp.reps})")
    else:
        bw = copy_bandwidth(lm.device)
    peak, bandwidth = mm.tflops * 1e12, bw.bytes_per_s
    phases = {}
    for phase, T, C in ((Phase.PREFILL, prompt_tokens, prompt_tokens), (Phase.DECODE, 1, context)):
        ops = layer_ops(lm, T, C)
        times = time_layer_ops(lm, T, C)
        for o in ops:
            o.intensity = o.flops / o.bytes
            o.bound_s = max(o.flops / peak, o.bytes / bandwidth)
            o.bound_by = "compute" if o.flops / peak > o.bytes / bandwidth else "memory"
            o.measured, o.measured_s = times[o.op], times[o.op].median
        phases[phase] = RooflinePhase(T, C, ops)
    weight_bytes = lm.facts.n_params * lm.arch.bytes_per_value
    kv = kv_bytes_formula(lm, context)
    return Roofline(peak, bandwidth, mm, bw, phases, bandwidth / (weight_bytes + kv), weight_bytes, kv)
