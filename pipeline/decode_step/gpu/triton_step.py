"""The fused step trimmed to four kernels a layer (Triton), for one token on a GPU: what a CUDA graph replays.

    why = unusable(fm)                 # None where the trimmed step serves this model (a Llama-layout decoder, Triton)
    step = TrimmedStep(dec)            # dec: the FusedDecoder whose buffers (K, V, tok, pos) it writes
    logits = step.body()               # [vocab] fp32: embedding, 30 x 4 kernels, the final norm and the LM head

Why. The torch step launches ~15 kernels a layer (norms as several, the products, RoPE's halves, the KV writes,
SDPA, SiLU, the adds); on an H200 SmolLM2's step took 2.18 ms as a CUDA graph where its weights' read takes ~60 µs:
the time is in the launches, not the bytes. pipeline.decode_step.gpu.triton_kernels fuses a layer into four: the input norm,
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

from pipeline.model.arch import NormKind, NormSpec, is_silu

# (BN rows a program, BK inputs a chunk) per kernel, on a GPU; the interpreter's come from the model's shape
GPU_BLOCKS = {"attend": (64, 64), "gate_up": (16, 64), "down": (8, 128), "head": (64, 64), "qkv": (0, 64)}
MAX_BLOCK = 1 << 20  # values in one block (Triton's limit)


def interpret_blocks(d: int, ff: int, vocab: int) -> dict:
    """Block sizes for Triton's interpreter, which runs each program in Python: as few programs as the shape allows,
    each input read in one chunk."""
    kd, kf = _pow2(d), _pow2(ff)
    return {
        "attend": (64, kd),
        "gate_up": (min(kf, MAX_BLOCK // kd), kd),
        "down": (min(kd, MAX_BLOCK // kf), kf),
        "head": (min(_pow2(vocab), MAX_BLOCK // kd), kd),
        "qkv": (0, kd),
    }


def _pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


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
        if not is_silu(ly.act) or any(type(m) is not torch.nn.Linear or m.bias is not None for m in (ly.out, ly.down)):
            return "a layer's activation or projections are not Llama's"
    if fm.D % 2 or fm.D & (fm.D - 1):
        return "the head dimension is not a power of two"
    return None


def _llama_norm(n) -> bool:
    return isinstance(n, NormSpec) and n.kind is NormKind.WEIGHT


class TrimmedStep:
    """The trimmed step for `rows` rows of one token each: static activations, the model's weights read in place.

        step = TrimmedStep(fm, rows, cos, sin)      # cos, sin: {rope kind: [positions, D]} (RopeTables.upto)
        logits = step.body(tok, pos, table, K, V)   # [rows, vocab] fp32, K/V written at each row's position

    K, V: the fused step's buffers [L, KV, max_len, D] (table: [rows, 1] zeros) or the engine's pool [L, blocks, KV,
    BS, D] (table: each row's blocks, [rows, nb], padding pointing at a block nobody reads)."""

    def __init__(self, fm, rows: int, cos: dict, sin: dict):
        from pipeline.decode_step.gpu import triton_kernels

        lm = fm.lm
        self.k, self.fm, self.rows, self.cos, self.sin = triton_kernels, fm, rows, cos, sin
        dev, dt = lm.device, lm.dtype
        self.E = lm.arch.embed().weight
        self.d = self.E.shape[1]
        self.ff = fm.layers[0].wgu.shape[0] // 2
        self.blocks = GPU_BLOCKS if dev.type == "cuda" else interpret_blocks(self.d, self.ff, self.E.shape[0])
        z = lambda *shape, dtype=dt: torch.zeros(shape, device=dev, dtype=dtype)  # noqa: E731
        self.x, self.xm, self.q, self.h = z(rows, self.d), z(rows, self.d), z(rows, fm.H * fm.D), z(rows, self.ff)
        self.P = z(rows, fm.H, self.d, dtype=torch.float32)
        head = lm.arch.unembedding()
        self.W_head, self.logits = head.weight, z(rows, head.weight.shape[0], dtype=torch.float32)
        if not all(t.is_contiguous() for t in [*cos.values(), *sin.values()]):  # the kernels index rows by D
            raise ValueError("the RoPE tables are not contiguous")

    def body(self, tok: torch.Tensor, pos: torch.Tensor, table: torch.Tensor, K: torch.Tensor, V: torch.Tensor) -> torch.Tensor:
        """One token a row (tok, pos: [rows] long on the device) through the model; returns logits [rows, vocab]."""
        k, fm, B, R = self.k, self.fm, self.blocks, self.rows
        d, FF, H, KV, D, G = self.d, self.ff, fm.H, fm.KV, fm.D, fm.G
        if not (K.is_contiguous() and V.is_contiguous() and table.is_contiguous()):
            raise ValueError("the KV buffers or the block table are not contiguous")
        paged = K.dim() == 5  # [L, blocks, KV, BS, D]; else [L, KV, max_len, D]
        stride_blk, stride_h, BS = (K.stride(1), K.stride(2), K.shape[3]) if paged else (0, K.stride(1), K.shape[2])
        at = (table, table.shape[1], BS, stride_blk, stride_h)  # where each row's keys and values lie
        torch.index_select(self.E, 0, tok, out=self.x)
        for i, ly in enumerate(fm.layers):
            cos, sin = self.cos[ly.rope], self.sin[ly.rope]
            bias = ly.bqkv if ly.bqkv is not None else ly.wqkv
            k.qkv_rope[(H + 2 * KV, R)](
                self.x, ly.norm_in.scale, ly.norm_in.eps, ly.wqkv, bias, cos, sin, pos, self.q, K[i], V[i], *at,
                d, H, KV, D, ly.bqkv is not None, B["qkv"][1],
            )  # fmt: skip
            k.attend_out[(H, R)](self.q, K[i], V[i], pos, ly.out.weight, self.P, ly.scale, *at, ly.window or 0, d, H, G, D, *B["attend"])
            k.gate_up[(-(-FF // B["gate_up"][0]), R)](self.x, self.P, self.xm, ly.norm_mid.scale, ly.norm_mid.eps, ly.wgu, self.h, d, H, FF, *B["gate_up"])
            k.down_add[(-(-d // B["down"][0]), R)](self.xm, ly.down.weight, self.h, self.x, d, FF, *B["down"])
        V_ = self.W_head.shape[0]
        final = fm.final_norm
        k.norm_head[(-(-V_ // B["head"][0]), R)](self.x, final.scale, final.eps, self.W_head, self.logits, d, V_, *B["head"])
        return self.logits
