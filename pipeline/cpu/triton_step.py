"""The fused step trimmed to four kernels a layer (Triton), for one token on a GPU: what a CUDA graph replays.

    why = unusable(fm)                 # None where the trimmed step serves this model (a Llama-layout decoder, Triton)
    step = TrimmedStep(dec)            # dec: the FusedDecoder whose buffers (K, V, tok, pos) it writes
    logits = step.body()               # [vocab] fp32: embedding, 30 x 4 kernels, the final norm and the LM head

Why. The torch step launches ~15 kernels a layer (norms as several, the products, RoPE's halves, the KV writes,
SDPA, SiLU, the adds); on an H200 SmolLM2's step took 2.18 ms as a CUDA graph where its weights' read takes ~60 µs:
the time is in the launches, not the bytes. pipeline.cpu.triton_kernels fuses a layer into four: the input norm,
Q/K/V, RoPE and the KV write; attention with the output projection; the residual, norm and gate/up with SiLU; the
down projection into the residual. About 125 kernels a step instead of ~450.

What it serves: decoders whose layers are Llama's (RMSNorm w * x, no sandwich or per-head norms, SiLU gate/up,
plain output and down projections, no logit softcap): Llama, SmolLM2, Mistral, Qwen2. Elsewhere `unusable` says why
and the torch step serves. FusedDecoder checks the trimmed step against the torch step once when it is built (one
token's logits) and keeps the torch step if they differ beyond the dtype's tolerance.

On a machine without a GPU Triton's interpreter runs the same kernels over CPU tensors (TRITON_INTERPRET=1, which
must be set before anything imports Triton: tests/conftest.py does): tests/pipeline/test_triton_step.py checks them there against the torch step and
`generate`; bench/gpu_check.py measures them on a lent GPU.
"""

from __future__ import annotations

import os

import torch

from pipeline.model.arch import NormKind, NormSpec

# (BN rows a program, BK inputs a chunk) per kernel; the interpreter runs each program in Python, so fewer, larger
GPU_BLOCKS = {"attend": (64, 64), "gate_up": (16, 64), "down": (8, 128), "head": (64, 64), "qkv": (0, 64)}
INTERPRET_BLOCKS = {"attend": (256, 1024), "gate_up": (512, 1024), "down": (256, 2048), "head": (1024, 1024), "qkv": (0, 1024)}


def unusable(fm) -> str | None:
    """Why the trimmed step cannot serve this model (None: it can)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "Triton is not installed"
    lm = fm.lm
    if lm.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return "no GPU (Triton's interpreter runs the kernels on a CPU where TRITON_INTERPRET=1 is set before start)"
    if lm.arch.softcap or type(fm.lm.arch.embed()) is not torch.nn.Embedding:
        return "the model scales its embeddings or caps its logits"
    head = lm.arch.unembedding()
    if type(head) is not torch.nn.Linear or head.bias is not None or not _llama_norm(fm.final_norm):
        return "the LM head or the final norm is not Llama's"
    for ly in fm.layers:
        if not (_llama_norm(ly.norm_in) and _llama_norm(ly.norm_mid)) or any(n is not None for n in (ly.norm_ff, ly.norm_out, ly.norm_q, ly.norm_k)):
            return "a layer's norms are not Llama's (sandwich or per-head norms)"
        if type(ly.act).__name__ not in ("SiLU", "SiLUActivation") or any(type(m) is not torch.nn.Linear or m.bias is not None for m in (ly.out, ly.down)):
            return "a layer's activation or projections are not Llama's"
    if fm.D % 2 or fm.D & (fm.D - 1):
        return "the head dimension is not a power of two"
    return None


def _llama_norm(n) -> bool:
    return isinstance(n, NormSpec) and n.kind is NormKind.WEIGHT


class TrimmedStep:
    """The trimmed step over one FusedDecoder's buffers: static activations, each layer's weights found once."""

    def __init__(self, dec):
        fm, lm = dec.fm, dec.lm
        from pipeline.cpu import triton_kernels

        self.k = triton_kernels
        self.dec, self.blocks = dec, GPU_BLOCKS if lm.device.type == "cuda" else INTERPRET_BLOCKS
        dev, dt = lm.device, lm.dtype
        self.E = lm.arch.embed().weight
        self.d = self.E.shape[1]
        self.ff = fm.layers[0].wgu.shape[0] // 2
        self.H, self.KV, self.D, self.G = fm.H, fm.KV, fm.D, fm.G
        z = lambda *shape, dtype=dt: torch.zeros(shape, device=dev, dtype=dtype)  # noqa: E731
        self.x, self.xm, self.q, self.h = z(self.d), z(self.d), z(self.H * self.D), z(self.ff)
        self.P = z(self.H, self.d, dtype=torch.float32)
        head = lm.arch.unembedding()
        self.W_head, self.logits = head.weight, z(head.weight.shape[0], dtype=torch.float32)
        self.final = fm.final_norm
        tables = [*dec.cos.values(), *dec.sin.values(), dec.K, dec.V]
        if not all(t.is_contiguous() and t.stride(-1) == 1 for t in tables):  # the kernels index rows by D
            raise ValueError("the RoPE tables or the KV buffers are not contiguous")

    def body(self):
        """One token (dec.tok) at dec.pos through the model; K/V written into dec.K, dec.V. Returns logits [vocab]."""
        k, dec, B = self.k, self.dec, self.blocks
        d, FF, H, KV, D, G = self.d, self.ff, self.H, self.KV, self.D, self.G
        torch.index_select(self.E, 0, dec.tok, out=self.x.view(1, d))
        stride = dec.K.stride(1)
        for i, ly in enumerate(dec.layers):
            Kc, Vc = dec.K[i], dec.V[i]
            cos, sin = dec.cos[ly.rope], dec.sin[ly.rope]
            bias = ly.bqkv if ly.bqkv is not None else ly.wqkv
            k.qkv_rope[(H + 2 * KV,)](
                self.x, ly.norm_in.scale, ly.norm_in.eps, ly.wqkv, bias, cos, sin, dec.pos, self.q, Kc, Vc,
                d, H, KV, D, stride, ly.bqkv is not None, B["qkv"][1],
            )  # fmt: skip
            k.attend_out[(H,)](self.q, Kc, Vc, dec.pos, ly.out.weight, self.P, ly.scale, ly.window or 0, d, H, G, D, stride, *B["attend"])
            k.gate_up[(-(-FF // B["gate_up"][0]),)](self.x, self.P, self.xm, ly.norm_mid.scale, ly.norm_mid.eps, ly.wgu, self.h, d, H, FF, *B["gate_up"])
            k.down_add[(-(-d // B["down"][0]),)](self.xm, ly.down.weight, self.h, self.x, d, FF, *B["down"])
        V = self.W_head.shape[0]
        k.norm_head[(-(-V // B["head"][0]),)](self.x, self.final.scale, self.final.eps, self.W_head, self.logits, d, V, *B["head"])
        return self.logits
