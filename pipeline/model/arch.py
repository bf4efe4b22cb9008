"""The architecture facts of one loaded model, worked out once at load time (`LoadedModel.arch`).

Everything else asks this adapter instead of probing the transformers model again: where the decoder and its
layers are, which norm feeds each feed-forward network, each layer's attention window, bytes per value, the
final logit softcap, the text config, and how close two computations in this dtype must agree.

    arch.decoder            the decoder stack (`model.model` for Llama / Gemma): embed_tokens, layers, norm
    arch.layers             [L] decoder layers
    arch.layer_types        [L] "full_attention" | "sliding_attention"
    arch.windows            [L] tokens a layer attends to (the new one included), None = every earlier token
    arch.embed()            the token embedding; arch.pos_embed(): learned positions (GPT-2), None with RoPE
    arch.final_norm_module()   the norm before the LM head
    arch.attn(i), arch.attn_out(i), arch.attn_out_weight(i)   layer i's attention, the projection that reads its
                            heads side by side (o_proj, GPT-2's c_proj) and that projection's [d, H*D] weight
    arch.ffn(i), arch.ffn_out(i)   layer i's feed-forward block and its last projection
    arch.in_norm(i)         the norm before attention (None: post-norm layers, OLMo-2)
    arch.ffn_input(i)       the module whose INPUT is the residual after attention (the pre-FFN norm, or the block)
    arch.post_norms(i)      (after attention, after the feed-forward block): Gemma's sandwich and OLMo-2's post-norms
    arch.pre_ffn_norm(i)    the norm whose INPUT is the residual after attention
    arch.bytes_per_value    bytes of one weight / activation / KV value in the model's dtype
    arch.softcap            final logit softcapping (Gemma 2) or None
    arch.tols               how closely two computations of the same numbers agree in this dtype (arch.tol: logits)
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, field
from enum import Enum

import torch
import torch.nn.functional as F

FP32_TOL = 1e-3  # two float32 computations of the same logits agree to this (different kernels)
HALF_TOL = 5e-2  # bf16 / fp16


def decoder_of(model: torch.nn.Module) -> torch.nn.Module:
    """The decoder stack of a causal LM (the one place that knows where transformers keeps it)."""
    return model.get_decoder() if hasattr(model, "get_decoder") else model.model


def bytes_per_value(dtype: torch.dtype) -> int:
    return torch.tensor([], dtype=dtype).element_size()


@dataclass(frozen=True)
class Tolerances:
    """How closely two computations of the same numbers agree in one dtype: the one place the checks read them."""

    logits: float  # the same logits through different kernels (fused step, engine, SDPA backends)
    trace_logits: float  # the hooked trace (eager attention, hooks) against transformers' default forward (SDPA)
    hidden: float  # hidden states after many layers (residual values of tens to hundreds, so absolute error grows)


def tolerances(dtype: torch.dtype) -> Tolerances:
    base = FP32_TOL if bytes_per_value(dtype) >= 4 else HALF_TOL
    return Tolerances(logits=base, trace_logits=50 * base, hidden=100 * base)


@dataclass
class Arch:
    model: torch.nn.Module = field(repr=False)
    decoder: torch.nn.Module = field(repr=False)
    layers: list = field(repr=False)
    text_config: object = field(repr=False)
    model_type: str
    layer_types: list[str]  # [L]
    windows: list[int | None]  # [L] tokens attended (the new one included); None = all earlier tokens
    sliding_window: int | None  # the config's window (tokens), when any layer slides
    bytes_per_value: int  # bytes per value in the model's dtype
    softcap: float | None  # final logit softcapping
    tols: Tolerances  # agreement expected between two computations of the same numbers

    @property
    def tol(self) -> float:
        """Two computations of the same logits through different kernels agree to this."""
        return self.tols.logits

    @classmethod
    def of(cls, model: torch.nn.Module, dtype: torch.dtype) -> Arch:
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        dec = decoder_of(model)
        layers = list(getattr(dec, "layers", None) or getattr(dec, "h", None) or [])
        mt = getattr(cfg, "model_type", "?")
        sw = getattr(cfg, "sliding_window", None)
        types = list(getattr(cfg, "layer_types", None) or [])
        if len(types) != len(layers):
            types = ["full_attention"] * len(layers)
        windows: list[int | None] = []
        for layer, t in zip(layers, types):
            w = getattr(getattr(layer, "self_attn", None), "sliding_window", None) or sw
            # Mistral slides every layer by its config; Gemma / Qwen2 only the layers typed as sliding
            windows.append(w if (t == "sliding_attention" or mt == "mistral") and w else None)
        return cls(
            model=model,
            decoder=dec,
            layers=layers,
            text_config=cfg,
            model_type=mt,
            layer_types=types,
            windows=windows,
            sliding_window=sw if any(windows) else None,
            bytes_per_value=bytes_per_value(dtype),
            softcap=getattr(model.config, "final_logit_softcapping", None) or getattr(cfg, "final_logit_softcapping", None),
            tols=tolerances(dtype),
        )

    @property
    def n_sliding(self) -> int:
        return sum(w is not None for w in self.windows)

    # ---- the model's parts by role: transformers' module names for each family (Llama-style, GPT-2, OLMo-2) ----
    def embed(self) -> torch.nn.Module:
        """The token embedding (Llama `embed_tokens`, GPT-2 `wte`)."""
        return self.model.get_input_embeddings()

    def pos_embed(self) -> torch.nn.Module | None:
        """Learned position embeddings (GPT-2 `wpe`); None for models that rotate positions (RoPE) instead."""
        return getattr(self.decoder, "wpe", None) or getattr(self.decoder, "embed_positions", None)

    @contextmanager
    def attention_as(self, impl: str):
        """The model's attention implementation switched to `impl` ("eager", "sdpa") inside the block, set back after
        (the model is shared: the caller holds lm.lock)."""
        was = self.model.config._attn_implementation
        self.model.set_attn_implementation(impl)
        try:
            yield
        finally:
            self.model.set_attn_implementation(was)

    def first_layers_model(self, k: int) -> torch.nn.Module:
        """A causal LM made of this model's first k layers + its final norm + LM head (modules shared, not copied):
        speculative decoding's early-exit draft. Built on the meta device, then every module is replaced by this
        model's, so no weights are allocated."""
        from transformers import AutoModelForCausalLM

        cfg = self.model.config.__class__.from_dict(self.model.config.to_dict())
        cfg.num_hidden_layers = k
        if getattr(cfg, "layer_types", None):
            cfg.layer_types = cfg.layer_types[:k]
        with torch.device("meta"):
            draft = AutoModelForCausalLM.from_config(cfg)
        dst = decoder_of(draft)
        for name, module in self.decoder.named_children():  # the layer stack cut to k, every other part as it is
            stack = isinstance(module, torch.nn.ModuleList) and len(module) == len(self.layers) and module[0] is self.layers[0]
            setattr(dst, name, torch.nn.ModuleList(self.layers[:k]) if stack else module)
        draft.set_output_embeddings(self.unembedding())
        draft.config._attn_implementation = self.model.config._attn_implementation
        return draft.eval()

    @staticmethod
    def cache_kv(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's (keys, values) [B, KV, t, D] held by one of transformers' caches (t < T on sliding layers)."""
        return [(layer.keys, layer.values) for layer in cache.layers]

    def final_norm_module(self) -> torch.nn.Module:
        """The norm before the LM head (Llama `norm`, GPT-2 `ln_f`)."""
        return _first_attr(self.decoder, "norm", "ln_f", "final_layernorm", "norm_f")

    def attn(self, i: int) -> torch.nn.Module:
        return _first_attr(self.layers[i], "self_attn", "attn")

    def attn_out(self, i: int) -> torch.nn.Module:
        """The projection whose input is the heads' outputs side by side, [.., H*D] -> [.., d] (o_proj, GPT-2 c_proj)."""
        return _first_attr(self.attn(i), "o_proj", "c_proj", "out_proj", "dense")

    def attn_out_weight(self, i: int) -> torch.Tensor:
        """attn_out(i)'s weight as [d, H*D] (GPT-2's Conv1D keeps it transposed)."""
        return _linear_weight(self.attn_out(i))

    def ffn(self, i: int) -> torch.nn.Module:
        return self.layers[i].mlp

    def ffn_out(self, i: int) -> torch.nn.Module:
        """The feed-forward block's last projection (down_proj, GPT-2 c_proj)."""
        return _first_attr(self.ffn(i), "down_proj", "c_proj", "fc2", "dense_4h_to_h")

    def qkv_projs(self, i: int) -> tuple | None:
        """Layer i's separate query, key and value projections (the Llama layout); None where they are fused (Phi-3's
        qkv_proj, GPT-2's c_attn)."""
        a = self.attn(i)
        if all(hasattr(a, n) for n in ("q_proj", "k_proj", "v_proj")):
            return a.q_proj, a.k_proj, a.v_proj
        return None

    def gate_up_projs(self, i: int) -> tuple | None:
        """Layer i's separate gate and up projections (a gated feed-forward block); None where fused or ungated."""
        m = self.ffn(i)
        if hasattr(m, "gate_proj") and hasattr(m, "up_proj"):
            return m.gate_proj, m.up_proj
        return None

    def act(self, i: int):
        """Layer i's feed-forward activation (callable), or None where the block does not expose it."""
        m = self.ffn(i)
        return getattr(m, "act_fn", None) or getattr(m, "act", None)

    def attn_scaling(self, i: int) -> float | None:
        """The factor layer i's attention scores are multiplied by (None where the module does not say)."""
        return getattr(self.attn(i), "scaling", None)

    def rotary(self) -> torch.nn.Module | None:
        """The decoder's RoPE module (cos / sin tables by position), None for models without RoPE."""
        return getattr(self.decoder, "rotary_emb", None)

    def unembedding(self) -> torch.nn.Module:
        """The unembedding: the last layer's vector -> a logit per vocabulary entry."""
        return self.model.get_output_embeddings()

    def in_norm(self, i: int) -> torch.nn.Module | None:
        """The norm before attention (Llama `input_layernorm`, GPT-2 `ln_1`); None for post-norm layers (OLMo-2)."""
        layer = self.layers[i]
        return getattr(layer, "input_layernorm", None) or getattr(layer, "ln_1", None)

    def post_norms(self, i: int) -> tuple:
        """(the norm of attention's output, the norm of the feed-forward block's output) before each joins the stream:
        Gemma's sandwich and OLMo-2's post-norms; (None, None) for pre-norm layers (Llama, GPT-2)."""
        layer = self.layers[i]
        if hasattr(layer, "post_feedforward_layernorm"):
            return layer.post_attention_layernorm, layer.post_feedforward_layernorm
        return None, None

    def ffn_input(self, i: int) -> torch.nn.Module:
        """The module whose INPUT is the residual after attention: the pre-FFN norm, or the block itself (OLMo-2)."""
        return self.pre_ffn_norm(i) or self.ffn(i)

    def pre_ffn_norm(self, i: int) -> torch.nn.Module | None:
        """The norm whose INPUT is the residual after attention: Llama `post_attention_layernorm`, Gemma
        `pre_feedforward_layernorm` (Gemma's post_attention_layernorm normalises attention's output), GPT-2 `ln_2`;
        None where the feed-forward block reads the residual itself (OLMo-2)."""
        layer = self.layers[i]
        if hasattr(layer, "pre_feedforward_layernorm"):
            return layer.pre_feedforward_layernorm
        if hasattr(layer, "post_feedforward_layernorm"):  # post-norm: post_attention_layernorm is attention's output's
            return None
        return getattr(layer, "post_attention_layernorm", None) or getattr(layer, "ln_2", None)

    def sandwich(self, i: int) -> bool:
        """Gemma-style layer: norms before and after both attention and the feed-forward network."""
        return hasattr(self.layers[i], "pre_feedforward_layernorm")

    def layer_norms(self, i: int) -> tuple:
        """Layer i's norms as our steps run them (norm_of): before attention, after it (Gemma) or before the MLP
        (Llama), then Gemma's before and after the MLP, then the per-head query and key norms (Qwen3, Gemma), None
        where the layer has none."""
        layer, a = self.layers[i], self.attn(i)
        sandwich = self.sandwich(i)
        return (
            norm_of(layer.input_layernorm),
            norm_of(layer.post_attention_layernorm),
            norm_of(layer.pre_feedforward_layernorm) if sandwich else None,
            norm_of(layer.post_feedforward_layernorm) if sandwich else None,
            norm_of(a.q_norm) if hasattr(a, "q_norm") else None,
            norm_of(a.k_norm) if hasattr(a, "k_norm") else None,
        )

    def final_norm(self):
        """The norm before the LM head, as our steps run it (norm_of)."""
        return norm_of(self.decoder.norm)

    def layer_kind(self, i: int) -> str:
        """'' for uniform models; Gemma-style models alternate local (sliding-window) and global layers."""
        if len(set(self.layer_types)) < 2:
            return ""
        if self.windows[i]:
            return f"a local layer: attends to the last {self.windows[i]:,} tokens only"
        return "a global layer: attends to every earlier token"

    def inv_freq(self, layer: int = 0):
        """[D/2] RoPE rotation frequencies of `layer` (a tensor), or None for models without RoPE."""
        rot = self.rotary()
        if rot is None:
            return None
        if hasattr(rot, "inv_freq"):
            return rot.inv_freq
        name = f"{self.layer_types[layer]}_inv_freq" if layer < len(self.layer_types) else None
        return getattr(rot, name, None) if name else None

    def apply_softcap(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.tanh(logits / self.softcap) * self.softcap if self.softcap else logits


def _first_attr(mod: torch.nn.Module, *names: str) -> torch.nn.Module:
    for n in names:
        m = getattr(mod, n, None)
        if m is not None:
            return m
    raise AttributeError(f"{type(mod).__name__} has none of {', '.join(names)}: an architecture the explorer does not know")


def _linear_weight(mod: torch.nn.Module) -> torch.Tensor:
    """A projection's weight as [out, in] (nn.Linear's layout; transformers' Conv1D, GPT-2's, keeps [in, out])."""
    return mod.weight.t() if type(mod).__name__ == "Conv1D" else mod.weight


@dataclass(frozen=True)
class FrozenNorm:
    """A norm frozen at the input x of one run, as the affine map it is there: norm(y) = (y - mean(y) if centred) * s
    + b at y = x, and for any y sharing x's statistics. What direct logit attribution splits a logit with."""

    s: torch.Tensor  # [d] float32
    centred: bool  # LayerNorm subtracts the mean; RMSNorm does not
    b: torch.Tensor | None  # [d] LayerNorm's bias
    denominator: float  # x's RMS (RMSNorm) or standard deviation (LayerNorm)

    def read(self, u: torch.Tensor) -> torch.Tensor:
        """A readout u . norm(y) as a readout of y itself: the vector r with r . y = u . (norm(y) - b)."""
        r = u * self.s
        return r - r.mean() if self.centred else r


def frozen_norm(mod: torch.nn.Module, x: torch.Tensor) -> FrozenNorm | None:
    """`mod` frozen at x ([d]); None for a norm whose formula we do not know."""
    x = x.detach().float().cpu()
    if isinstance(mod, torch.nn.LayerNorm):
        eps = float(mod.eps)
        sd = float(torch.sqrt(x.var(unbiased=False) + eps))
        w = mod.weight.detach().float().cpu() if mod.weight is not None else torch.ones_like(x)
        b = mod.bias.detach().float().cpu() if mod.bias is not None else None
        return FrozenNorm(w / sd, True, b, sd)
    spec = norm_spec(mod)
    if spec is None:
        return None
    rms = float(torch.sqrt(x.pow(2).mean() + spec.eps))
    return FrozenNorm(spec.scale.detach().float().cpu() / rms, False, None, rms)


class NormKind(Enum):
    """Which RMSNorm formula a module uses: WEIGHT scales the normalised row by w (Llama, Mistral, Qwen),
    ONE_PLUS_WEIGHT by (1 + w) in fp32 (Gemma 3)."""

    WEIGHT = "weight"
    ONE_PLUS_WEIGHT = "one_plus_weight"


# The RMSNorms our own steps re-implement (the row step, the fused step), by module type. Another norm: the
# steps are not offered (pipeline.decode_step.fused.supported), the model runs through transformers' forward.
NORM_KINDS: dict[str, NormKind] = {
    "LlamaRMSNorm": NormKind.WEIGHT,
    "MistralRMSNorm": NormKind.WEIGHT,
    "Qwen2RMSNorm": NormKind.WEIGHT,
    "Qwen3RMSNorm": NormKind.WEIGHT,
    "Phi3RMSNorm": NormKind.WEIGHT,
    "Olmo2RMSNorm": NormKind.WEIGHT,  # w * normalise(x) in fp32, then the cast: the same in float32
    "Gemma3RMSNorm": NormKind.ONE_PLUS_WEIGHT,
}


@dataclass(frozen=True)
class NormSpec:
    """An RMSNorm module's formula: normalise(x) * scale, with `eps`; `scale` is w or (1 + w) in fp32. Called on a
    tensor it is that norm as one fused `F.rms_norm` plus casts (8 kernels -> 3-4 on a GPU), with the module's own
    semantics: Llama-style `w * normalise(x in fp32).to(dtype)`; Gemma `normalise(x) * (1 + w)` in fp32."""

    kind: NormKind
    eps: float
    scale: torch.Tensor

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        d = self.scale.shape[0]
        if self.kind is NormKind.WEIGHT:
            return self.scale * F.rms_norm(x.float(), (d,), eps=self.eps).to(x.dtype)
        return F.rms_norm(x.float(), (d,), weight=self.scale, eps=self.eps).type_as(x)


def is_silu(act) -> bool:
    """Whether a feed-forward activation (Arch.act) is SiLU, the one our C and Triton kernels apply themselves."""
    return type(act).__name__ in ("SiLU", "SiLUActivation")


def norm_of(mod):
    """The module's norm as our steps run it: its NormSpec (callable), or the module itself where its kind is not
    one our steps implement."""
    return norm_spec(mod) or mod


def norm_spec(mod) -> NormSpec | None:
    """The module's RMSNorm formula (None: not one our steps implement)."""
    kind = NORM_KINDS.get(type(mod).__name__)
    if kind is None:
        return None
    w = mod.weight
    if kind is NormKind.ONE_PLUS_WEIGHT:
        return NormSpec(kind, float(mod.eps), 1.0 + w.detach().float())
    return NormSpec(kind, float(getattr(mod, "variance_epsilon", getattr(mod, "eps", 1e-6))), w)
