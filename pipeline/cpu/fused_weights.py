"""The fused layer weights every decode step shares: Q/K/V and gate/up concatenated once per model (views of the
model's own parameters), each layer's norms, window and RoPE type, and the model's RoPE tables. Used by the torch
step (pipeline.cpu.fused), the engine's batched step (engine.paged) and the CPU row step (pipeline.cpu.row_step)."""

from __future__ import annotations

import inspect
import threading
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pipeline.model.arch import norm_spec
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
    core, layers = lm.arch.decoder, lm.arch.layers
    if not layers or not hasattr(core, "rotary_emb"):
        return False, "the model has no `model.layers` / `model.rotary_emb` in the Llama layout."
    for layer in layers:
        a, m = getattr(layer, "self_attn", None), getattr(layer, "mlp", None)
        if not all(hasattr(a, p) for p in ("q_proj", "k_proj", "v_proj", "o_proj", "scaling")) or not all(
            hasattr(m, p) for p in ("gate_proj", "up_proj", "down_proj", "act_fn")
        ):
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


def norm_fn(mod):
    """The module's RMSNorm as one fused `F.rms_norm` kernel plus casts (8 kernels -> 3-4 on a GPU), with the
    module's own semantics: Llama-style `w * normalise(x in fp32).to(dtype)`; Gemma `normalise(x) * (1 + w)` in
    fp32. Other norms: the module itself."""
    spec = norm_spec(mod)  # the adapter's formula (pipeline.model.arch)
    if spec is None:
        return mod
    d, eps, scale = mod.weight.shape[0], spec.eps, spec.scale
    if spec.kind == "weight":
        return lambda x: scale * F.rms_norm(x.float(), (d,), eps=eps).to(x.dtype)
    return lambda x: F.rms_norm(x.float(), (d,), weight=scale, eps=eps).type_as(x)


@dataclass
class _Layer:
    wqkv: torch.Tensor
    bqkv: torch.Tensor | None
    wgu: torch.Tensor
    window: int | None  # sliding window (tokens attended, the current one included) or None
    rope: str  # key into the cos/sin tables
    norm_in: object  # before attention
    norm_mid: object  # after attention (Gemma) or before the MLP (Llama)
    norm_ff: object = None  # Gemma: before the MLP
    norm_out: object = None  # Gemma: after the MLP
    q_norm: object = None  # Qwen3 / Gemma: per-head norms of queries and keys
    k_norm: object = None


def fuse_weights(lm: LoadedModel) -> list[_Layer]:
    """Fused QKV and gate/up per layer (views shared with the model's own parameters); done once per model."""
    ok, why = supported(lm)
    if not ok:
        raise FusedUnsupported(why)
    arch = lm.arch
    out = []
    with lm.lock, _fuse_lock, torch.no_grad():  # no forward runs while parameters are re-pointed
        if lm.model in _fused:
            return _fused[lm.model]
        for i, layer in enumerate(arch.layers):
            a, m = layer.self_attn, layer.mlp
            wqkv, bqkv = _fuse([a.q_proj, a.k_proj, a.v_proj])
            wgu, _ = _fuse([m.gate_proj, m.up_proj])
            sandwich = arch.sandwich(i)
            out.append(
                _Layer(
                    wqkv,
                    bqkv,
                    wgu,
                    arch.windows[i],
                    arch.layer_types[i],
                    norm_fn(layer.input_layernorm),
                    norm_fn(layer.post_attention_layernorm),
                    norm_fn(layer.pre_feedforward_layernorm) if sandwich else None,
                    norm_fn(layer.post_feedforward_layernorm) if sandwich else None,
                    norm_fn(a.q_norm) if hasattr(a, "q_norm") else None,
                    norm_fn(a.k_norm) if hasattr(a, "k_norm") else None,
                )
            )
        _fused[lm.model] = out
    return out


def rope_tables(lm: LoadedModel, layers: list[_Layer], n_positions: int) -> tuple[dict, dict]:
    """The model's own RoPE cos / sin for positions 0..n_positions-1, one table [n_positions, D] per layer type
    (Gemma 3 rotates local and global layers differently), from its rotary_emb module."""
    core, D = lm.arch.decoder, lm.facts.head_dim
    pos_ids = torch.arange(n_positions, device=lm.device)[None]
    dummy = torch.zeros(1, 1, D, device=lm.device, dtype=lm.dtype)
    cos, sin = {}, {}
    with torch.no_grad():
        for lt in {ly.rope for ly in layers}:
            args = (lt,) if "layer_type" in inspect.signature(core.rotary_emb.forward).parameters else ()
            cs, sn = core.rotary_emb(dummy, pos_ids, *args)
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
