"""The fused layer weights every decode step shares: Q/K/V and gate/up concatenated once per model (views of the
model's own parameters), each layer's norms, window and RoPE type, and the model's RoPE tables. Used by the torch
step (pipeline.decode_step.fused), the engine's batched step (engine.paged) and the CPU row step (pipeline.decode_step.cpu.row_step)."""

from __future__ import annotations

import inspect
import threading
import weakref
from dataclasses import dataclass

import torch

from pipeline.model.loaded import LoadedModel

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3", "gemma3_text")


class FusedUnsupported(RuntimeError):
    """The loaded model's architecture is not one our fused step implements; the message says why."""


def supported(lm: LoadedModel) -> tuple[bool, str]:
    c = lm.arch.text_config
    mt = lm.arch.model_type
    if mt not in SUPPORTED_TYPES:
        return False, (f"the fused decode step implements {', '.join(SUPPORTED_TYPES)}; this model is '{mt}'. The dynamic and static cache loops work for it.")
    if getattr(c, "attn_logit_softcapping", None):
        return False, "attn_logit_softcapping is set in this model's config; the fused step does not implement it."
    arch = lm.arch
    if not arch.layers or arch.rotary() is None:
        return False, "the model has no decoder layers with RoPE in the Llama layout."
    for i in range(len(arch.layers)):
        if arch.qkv_projs(i) is None or arch.gate_up_projs(i) is None or arch.attn_scaling(i) is None or arch.act(i) is None:
            return False, "a layer lacks the q/k/v/o and gate/up/down projections of the Llama layout."
    return True, ""


_fuse_lock = threading.Lock()
_fused: weakref.WeakKeyDictionary[torch.nn.Module, list] = weakref.WeakKeyDictionary()


def _fuse(mods: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Concatenate the weights (and biases) of `mods` along the output dimension, then re-point each module's
    weight as a view into the result: one matmul instead of len(mods), and no extra memory."""
    fused_w = torch.cat([m.weight.detach() for m in mods], 0).contiguous()
    r = 0
    for m in mods:
        n = m.weight.shape[0]
        m.weight = torch.nn.Parameter(fused_w[r : r + n], requires_grad=False)
        r += n
    if all(m.bias is None for m in mods):
        return fused_w, None
    return fused_w, torch.cat(
        [m.bias.detach() if m.bias is not None else torch.zeros(m.weight.shape[0], dtype=fused_w.dtype, device=fused_w.device) for m in mods]
    )


@dataclass
class _Layer:
    wqkv: torch.Tensor
    bqkv: torch.Tensor | None
    wgu: torch.Tensor
    window: int | None  # sliding window (tokens attended, the current one included) or None
    rope: str  # key into the cos/sin tables
    out: torch.nn.Module  # attention's output projection (the model's own module)
    down: torch.nn.Module  # the feed-forward block's down projection
    act: object  # the feed-forward activation (callable)
    scale: float  # attention's score scaling
    # the norms as our steps run them (pipeline.model.arch.norm_of: a NormSpec, callable, or the module itself)
    norm_in: object  # before attention
    norm_mid: object  # after attention (Gemma) or before the MLP (Llama)
    norm_ff: object = None  # Gemma: before the MLP
    norm_out: object = None  # Gemma: after the MLP
    norm_q: object = None  # Qwen3 / Gemma: per-head norms of queries and keys
    norm_k: object = None


def fuse_weights(lm: LoadedModel) -> list[_Layer]:
    """Fused QKV and gate/up per layer (views shared with the model's own parameters), each layer's norms resolved
    by the adapter; done once per model (however many LoadedModels share its parameters)."""
    ok, why = supported(lm)
    if not ok:
        raise FusedUnsupported(why)
    arch = lm.arch
    with lm.lock, _fuse_lock, torch.no_grad():  # no forward runs while parameters are re-pointed
        if lm.model not in _fused:
            fused = [(_fuse(list(arch.qkv_projs(i))), _fuse(list(arch.gate_up_projs(i)))) for i in range(len(arch.layers))]
            _fused[lm.model] = [
                _Layer(
                    wqkv,
                    bqkv,
                    wgu,
                    arch.windows[i],
                    arch.layer_types[i],
                    arch.attn_out(i),
                    arch.ffn_out(i),
                    arch.act(i),
                    float(arch.attn_scaling(i)),
                    *arch.layer_norms(i),
                )
                for i, ((wqkv, bqkv), (wgu, _)) in enumerate(fused)
            ]
    return _fused[lm.model]


class FusedModel:
    """Everything our decode steps share for one model, built once (`fused_model`) and kept on the model: its fused
    layers, final norm and RoPE tables, its shape, and the steps built over them (pipeline.decode_step.fused's decoders by
    buffer size, pipeline.decode_step.cpu.row_step's RowStep). The torch step, the engine's batched step and the CPU row step
    all start from it."""

    def __init__(self, lm: LoadedModel):
        self.lm = lm
        self.layers = fuse_weights(lm)
        self.rope = RopeTables(lm, self.layers)
        f = lm.facts
        self.H, self.KV, self.D = f.n_heads, f.n_kv_heads, f.head_dim
        self.G = self.H // self.KV
        self.windows = sorted({ly.window for ly in self.layers if ly.window})
        self.decoders: dict = {}  # pipeline.decode_step.fused: FusedDecoders by (size, graph, compile, trimmed)
        self.row = None  # pipeline.decode_step.cpu.row_step: the RowStep, built on first use
        self.final_norm = lm.arch.final_norm()


def fused_model(lm: LoadedModel) -> FusedModel:
    """The model's FusedModel (built on first use, kept on the model, freed with it). FusedUnsupported says why a
    model cannot have one."""
    return lm.owned("fused", FusedModel)


def rope_tables(lm: LoadedModel, layers: list[_Layer], n_positions: int) -> tuple[dict, dict]:
    """The model's own RoPE cos / sin for positions 0..n_positions-1, one table [n_positions, D] per layer type
    (Gemma 3 rotates local and global layers differently), from its RoPE module (the adapter's rotary())."""
    rotary, D = lm.arch.rotary(), lm.facts.head_dim
    pos_ids = torch.arange(n_positions, device=lm.device)[None]
    dummy = torch.zeros(1, 1, D, device=lm.device, dtype=lm.dtype)
    cos, sin = {}, {}
    with torch.no_grad():
        for lt in {ly.rope for ly in layers}:
            args = (lt,) if "layer_type" in inspect.signature(rotary.forward).parameters else ()
            cs, sn = rotary(dummy, pos_ids, *args)
            cos[lt], sin[lt] = cs[0].contiguous(), sn[0].contiguous()
    return cos, sin


class RopeTables:
    """A step's RoPE tables (rope_tables), grown on demand: by doubling from 256 positions, never past the model's
    context window, under a lock (two threads stepping at once never see a half-grown table). `upto(n)` returns
    the torch tables {layer type: [positions, D]} for positions 0..n-1 at least; `numpy(n)` the same as numpy views.
    The one growth rule the engine's batched step and the CPU row step share."""

    def __init__(self, lm: LoadedModel, layers: list[_Layer]):
        self.lm, self.layers = lm, layers
        self.size = 0
        self.cos: dict = {}
        self.sin: dict = {}
        self._np: tuple[dict, dict] = ({}, {})
        self._lock = threading.Lock()

    def upto(self, n: int) -> tuple[dict, dict]:
        if n > self.size:
            with self._lock:
                if n > self.size:
                    size = max(256, self.size)
                    while size < n:
                        size *= 2
                    size = min(size, self.lm.facts.max_positions or size)
                    cos, sin = rope_tables(self.lm, self.layers, size)
                    self._np = ({k: v.numpy() for k, v in cos.items()}, {k: v.numpy() for k, v in sin.items()}) if self.lm.device.type == "cpu" else ({}, {})
                    self.cos, self.sin, self.size = cos, sin, size
        return self.cos, self.sin

    def numpy(self, n: int) -> tuple[dict, dict]:
        self.upto(n)
        return self._np
