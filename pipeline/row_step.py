"""One request's decode step on a CPU, at the speed of reading the weights once.

Decoding one token multiplies one row of activations by every weight matrix: for SmolLM2 in fp32 that is
538 MB read from memory per token and only 0.27 GFLOP of arithmetic, so the step cannot be faster than the
memory streams those bytes (bench/bench_cpu_anchor.py measures both). Where the time goes, measured on the
project's 2-core build machine (SmolLM2, 30 layers, bench/bench_cpu_anchor.py, the "row step" split):

  * the 121 matrix-vector products (Q/K/V fused, output, gate/up fused, down, per layer; then the LM head over
    49,152 rows): about 42-46 ms a token, OpenBLAS's sgemv on the weights' own memory (pipeline.cpu_matmul);
  * everything else (norms, RoPE, writing K/V, attention over the context, SiLU, residual adds, the top
    candidates): about 2-4 ms a token for ~25 small operations per layer.

The same step written with torch operators (pipeline.fused, what a GPU runs as one CUDA graph) spends 18-24 ms a
token on the second part: each of its ~600 operators costs 4-7 µs of dispatch on this CPU (F.rms_norm alone
34 µs: it is a composite of six kernels), and SDPA's CPU kernel 69 µs per layer for one query. So this step
does the small work in numpy on views of the model's own tensors (nothing is copied: the arrays ARE the torch
parameters' memory), where an operator on a vector costs 1-2 µs and a scalar is a Python float; the model's
own embedding and activation modules are called as they are. The maths is the model's, written out:

    x = embed(token)
    for each layer:
        h   = rms_norm(x) * w                       (Gemma: * (1 + w), and norms after attention and MLP too)
        q, k, v = split(Wqkv @ h)                   (Qwen3 / Gemma: per-head norms of q and k)
        q, k = rope(q, pos), rope(k, pos)
        K[pos], V[pos] = k, v                       (the caller's KV memory: a static buffer or paged blocks)
        a   = softmax(q · K[:pos+1]ᵀ · scale) · V   (each KV head serves its G query heads; a sliding layer
                                                     reads only its window)
        x   = x + Wo @ a
        g, u = split(Wgu @ rms_norm(x) * w)
        x   = x + Wdown @ (act(g) * u)
    logits = E @ (rms_norm(x) * w)

Every product is the model's own, in another summation order: logits within 1e-4 of transformers' forward and
greedy tokens identical to `generate` (tests/pipeline/test_fused.py). Used on a CPU in fp32 for one row at a
time: the engine's lone request (engine.paged) and our own loop's "fused" mode (pipeline.fused).
"""

from __future__ import annotations

import math
import threading
import weakref

import numpy as np
import torch

from .models import LoadedModel

LLAMA_NORMS = {"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"}


def _arr(t: torch.Tensor) -> np.ndarray:
    """A numpy view of a CPU tensor's memory (no copy)."""
    return t.detach().numpy()


class Norm:
    """An RMSNorm with the module's own formula: Llama `w * (x / rms(x))`, Gemma `(x / rms(x)) * (1 + w)`."""

    def __init__(self, mod):
        name = type(mod).__name__
        if name in LLAMA_NORMS:
            self.eps, self.scale = mod.variance_epsilon, _arr(mod.weight)
        elif name == "Gemma3RMSNorm":
            self.eps, self.scale = mod.eps, (1.0 + mod.weight.detach().float()).numpy()
        else:
            raise ValueError(f"no row-step norm for {name}")

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """x [..., d]: each row normalised by its own root mean square."""
        if x.ndim == 1:
            r = 1.0 / math.sqrt(float(x @ x) / x.shape[0] + self.eps)
            h = x * np.float32(r)
        else:
            h = x / np.sqrt(np.einsum("...i,...i->...", x, x)[..., None] / x.shape[-1] + self.eps).astype(np.float32)
        h *= self.scale
        return h


class _RowLayer:
    def __init__(self, layer, ly):
        a, m = layer.self_attn, layer.mlp
        self.wqkv, self.wo, self.wgu, self.wdown = _arr(ly.wqkv), _arr(a.o_proj.weight), _arr(ly.wgu), _arr(m.down_proj.weight)
        self.bqkv = None if ly.bqkv is None else _arr(ly.bqkv)
        self.bo = None if a.o_proj.bias is None else _arr(a.o_proj.bias)
        self.bdown = None if m.down_proj.bias is None else _arr(m.down_proj.bias)
        self.act = m.act_fn
        self.scale = float(a.scaling)
        self.window, self.rope = ly.window, ly.rope
        self.norm_in, self.norm_mid = Norm(layer.input_layernorm), Norm(layer.post_attention_layernorm)
        sandwich = ly.norm_ff is not None
        self.norm_ff = Norm(layer.pre_feedforward_layernorm) if sandwich else None
        self.norm_out = Norm(layer.post_feedforward_layernorm) if sandwich else None
        self.q_norm = Norm(a.q_norm) if ly.q_norm is not None else None
        self.k_norm = Norm(a.k_norm) if ly.k_norm is not None else None


def _mv(w: np.ndarray, x: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    y = w @ x  # OpenBLAS sgemv: the weight streamed once
    if b is not None:
        y += b
    return y


class RowStep:
    """The model's decode step for one token, over numpy views of its weights. Built once per model (`row_step`).

        step.logits(token, pos, kv)   -> torch [vocab] float32
    where kv has write(layer, pos, k [KV, D], v [KV, D]) and read(layer, lo, hi) -> (K, V) [KV, hi - lo, D]."""

    def __init__(self, lm: LoadedModel):
        from .fused import fuse_weights

        self.lm = lm
        layers = fuse_weights(lm)
        f = lm.facts
        self.H, self.KV, self.D = f.n_heads, f.n_kv_heads, f.head_dim
        self.G = self.H // self.KV
        self.layers = [_RowLayer(layer, ly) for layer, ly in zip(lm.arch.layers, layers)]
        self.final_norm = Norm(lm.arch.decoder.norm)
        self.head = _arr(lm.model.lm_head.weight)
        self.head_bias = None if getattr(lm.model.lm_head, "bias", None) is None else _arr(lm.model.lm_head.bias)
        self._layers_fused = layers
        self._rope_len = 0
        self._rope_lock = threading.Lock()
        self.cos: dict[str, np.ndarray] = {}
        self.sin: dict[str, np.ndarray] = {}

    def _rope(self, n: int) -> None:
        from .fused import rope_tables

        if n <= self._rope_len:
            return
        with self._rope_lock:
            size = max(256, self._rope_len)
            while size < n:
                size *= 2
            size = min(size, self.lm.facts.max_positions or size)
            cos, sin = rope_tables(self.lm, self._layers_fused, size)
            self.cos = {k: v.numpy() for k, v in cos.items()}
            self.sin = {k: v.numpy() for k, v in sin.items()}
            self._rope_len = size

    def logits(self, token: int, pos: int, kv) -> torch.Tensor:
        """The logits [vocab] (float32 torch) of the token after `token` at position `pos`; its K/V written."""
        self._rope(pos + 1)
        with torch.no_grad():
            return self._logits(token, pos, kv)

    def _logits(self, token: int, pos: int, kv) -> torch.Tensor:
        H, KV, D, G = self.H, self.KV, self.D, self.G
        half = D // 2
        x = _arr(self.lm.arch.decoder.embed_tokens(torch.tensor([[int(token)]]))).reshape(-1).copy()
        tables = {lt: (self.cos[lt][pos], self.sin[lt][pos]) for lt in self.cos}
        for i, ly in enumerate(self.layers):
            qkv = _mv(ly.wqkv, ly.norm_in(x), ly.bqkv).reshape(H + 2 * KV, D)
            qk, v = qkv[: H + KV], qkv[H + KV :]
            if ly.q_norm is not None:
                qk = np.concatenate([ly.q_norm(qk[:H]), ly.k_norm(qk[H:])])
            cos, sin = tables[ly.rope]
            rot = np.empty_like(qk)  # RoPE: qk * cos + rotate_half(qk) * sin
            np.negative(qk[:, half:], out=rot[:, :half])
            rot[:, half:] = qk[:, :half]
            rot *= sin
            qk = qk * cos
            qk += rot
            kv.write(i, pos, qk[H:], v)
            K, V = kv.read(i, max(0, pos + 1 - ly.window) if ly.window else 0, pos + 1)
            s = np.matmul(qk[:H].reshape(KV, G, D), K.transpose(0, 2, 1))  # [KV, G, n]
            s *= np.float32(ly.scale)
            s -= s.max(-1, keepdims=True)
            np.exp(s, out=s)
            s /= s.sum(-1, keepdims=True)
            a = np.matmul(s, V).reshape(H * D)
            o = _mv(ly.wo, a, ly.bo)
            if ly.norm_ff is not None:  # Gemma: norms after attention, before and after the MLP
                x += ly.norm_mid(o)
                h = ly.norm_ff(x)
            else:
                x += o
                h = ly.norm_mid(x)
            gu = _mv(ly.wgu, h)
            g, u = gu[: gu.shape[0] // 2], gu[gu.shape[0] // 2 :]
            m = _mv(ly.wdown, _arr(ly.act(torch.from_numpy(g))) * u, ly.bdown)  # the model's own activation
            x += ly.norm_out(m) if ly.norm_out is not None else m
        out = torch.from_numpy(_mv(self.head, self.final_norm(x), self.head_bias))
        return self.lm.arch.apply_softcap(out)


def usable(lm: LoadedModel) -> bool:
    """On a CPU in fp32, for the architectures the fused step implements (its Norms included)."""
    from .fused import supported

    if lm.device.type != "cpu" or lm.dtype != torch.float32 or not ROW_STEP or not supported(lm)[0]:
        return False
    names = {type(getattr(layer, n)).__name__ for layer in lm.arch.layers for n in ("input_layernorm", "post_attention_layernorm")}
    return names <= LLAMA_NORMS | {"Gemma3RMSNorm"}


ROW_STEP = True  # the bench turns it off to measure the torch step in its place
_steps: weakref.WeakKeyDictionary[torch.nn.Module, RowStep] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def row_step(lm: LoadedModel) -> RowStep | None:
    """The model's RowStep (built once), or None where it does not apply (see usable)."""
    if not usable(lm):
        return None
    with _lock:
        st = _steps.get(lm.model)
        if st is None:
            st = _steps[lm.model] = RowStep(lm)
        return st


class BufferKV:
    """K/V in static buffers [layers, KV, max_len, D] (pipeline.fused's)."""

    def __init__(self, K: torch.Tensor, V: torch.Tensor):
        self.K, self.V = _arr(K), _arr(V)

    def write(self, i: int, pos: int, k: np.ndarray, v: np.ndarray) -> None:
        self.K[i, :, pos] = k
        self.V[i, :, pos] = v

    def read(self, i: int, lo: int, hi: int):
        return self.K[i, :, lo:hi], self.V[i, :, lo:hi]


class PagedKV:
    """K/V in the engine's blocks [layers, blocks, KV, block_size, D], one request's block table."""

    def __init__(self, K: torch.Tensor, V: torch.Tensor, table: list[int]):
        self.K, self.V = _arr(K), _arr(V)
        self.table = np.asarray(table)
        self.bs = self.K.shape[3]

    def write(self, i: int, pos: int, k: np.ndarray, v: np.ndarray) -> None:
        b, o = self.table[pos // self.bs], pos % self.bs
        self.K[i, b, :, o] = k
        self.V[i, b, :, o] = v

    def read(self, i: int, lo: int, hi: int):
        b0, b1 = lo // self.bs, -(-hi // self.bs)
        ids = self.table[b0:b1]
        KV, D = self.K.shape[2], self.K.shape[4]
        k = self.K[i, ids].transpose(1, 0, 2, 3).reshape(KV, -1, D)
        v = self.V[i, ids].transpose(1, 0, 2, 3).reshape(KV, -1, D)
        a = lo - b0 * self.bs
        return k[:, a : a + hi - lo], v[:, a : a + hi - lo]
