"""int8 weight-only models (issue 49): each projection matrix quantised per output row, symmetric, one fp32 scale per
row, the one quantiser the precision lesson (pipeline.decode_step.cpu.precision) and an int8 model (`load_model(precision="int8")`)
share.

    w8, scale = quantise_rows(w)       # w [N, K] fp32 -> int8 [N, K], scale [N]: w ~ w8 * scale[:, None]
    quantise(model, arch)              # every layer's q/k/v/o, gate/up/down and the LM head, in place

An int8 model keeps both: each module's weight becomes the dequantised matrix (w8 * scale, fp32), so transformers'
own forward (the trace, the pages, `generate`) computes with exactly the weights the engine serves, and the module
keeps (w8, scale) as `INT8` for the CPU decode's int8 panels (pipeline.decode_step.cpu.row_step), read 1 byte a weight. A tied LM
head is untied: the embedding stays fp32 (as norms, RoPE, attention and the KV cache do)."""

from __future__ import annotations

import torch

PRECISIONS = ("fp32", "int8")
INT8 = "int8_rows"  # the attribute under which a quantised module keeps (w8 [N, K] int8, scale [N] fp32)


def quantise_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (w8 int8 [N, K], scale fp32 [N]): each row scaled to [-127, 127] by its largest magnitude and rounded
    to the nearest integer (symmetric; an all-zero row gets a tiny scale and zeros)."""
    w = w.detach().float()
    scale = (w.abs().amax(1) / 127).clamp_min(1e-12)
    w8 = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8).contiguous()
    return w8, scale.contiguous()


def dequantised(w8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """w8 * scale per row as fp32: the weights an int8 model's torch forward computes with."""
    return w8.float() * scale[:, None]


def projections(arch) -> list[torch.nn.Module]:
    """The modules an int8 model quantises: every layer's q/k/v, o, gate/up and down (the Llama layout), then the LM head."""
    mods = []
    for i in range(len(arch.layers)):
        qkv, gu = arch.qkv_projs(i), arch.gate_up_projs(i)
        if qkv is None or gu is None:
            raise ValueError("int8 serving needs the Llama layout: separate q/k/v and gate/up projections in every layer")
        mods += [*qkv, arch.attn_out(i), *gu, arch.ffn_out(i)]
    return [*mods, arch.unembedding()]


def quantise(model: torch.nn.Module, arch) -> int:
    """Every projection of `model` (projections) quantised in place: its weight the dequantised fp32 matrix, (w8,
    scale) kept on the module as INT8. Returns the bytes the int8 matrices and their scales take."""
    total = 0
    with torch.no_grad():
        for m in projections(arch):
            if not isinstance(getattr(m, "weight", None), torch.Tensor) or m.weight.dim() != 2:
                raise ValueError(f"int8 serving quantises linear layers, not {type(m).__name__}")
            w8, scale = quantise_rows(m.weight)
            m.weight = torch.nn.Parameter(dequantised(w8, scale), requires_grad=False)  # a tied head: untied here
            setattr(m, INT8, (w8, scale))
            total += w8.numel() + scale.numel() * 4
    return total


def rows_of(*mods: torch.nn.Module) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The modules' int8 rows stacked along the outputs (fused Q/K/V, gate/up), as one (w8, scale); None where any module
    is not quantised (an fp32 model)."""
    got = [getattr(m, INT8, None) for m in mods]
    if any(g is None for g in got):
        return None
    if len(got) == 1:
        return got[0]
    return torch.cat([g[0] for g in got]).contiguous(), torch.cat([g[1] for g in got]).contiguous()


def layer_rows(arch, i: int) -> dict | None:
    """Layer i's four products as int8 rows {"qkv", "o", "gu", "down": (w8, scale)}, or None (not quantised)."""
    qkv, gu = arch.qkv_projs(i), arch.gate_up_projs(i)
    if qkv is None or gu is None:
        return None
    out = {"qkv": rows_of(*qkv), "o": rows_of(arch.attn_out(i)), "gu": rows_of(*gu), "down": rows_of(arch.ffn_out(i))}
    return None if any(v is None for v in out.values()) else out
