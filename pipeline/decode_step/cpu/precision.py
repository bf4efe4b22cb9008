"""Lower precision as a lesson: the CPU row step (pipeline.decode_step.cpu.row_step) with its matrices in bf16 or in int8
(weight-only), beside the fp32 default, on one request.

Production engines serve in bf16 and often quantise weights to int8 or fewer bits: a decode step reads every
weight once, so halving the bytes per weight can halve the time per token, if a kernel streams the smaller
weights as fast. The price is numerics: each product is rounded differently, the logits move, and where two
candidates were close the greedy choice can flip. This module measures both on the loaded model:

  * bf16: every projection and the LM head as bfloat16, activations rounded to bf16 going in; 2 bytes per weight;
  * int8 weight-only: each output row of each matrix scaled to [-127, 127] and rounded (symmetric, one fp32
    scale per row), activations stay fp32; 1 byte per weight plus the scales;
  * fp32: the default, the reference.
Where pipeline/decode_step/cpu/cpu_decode.c is built, every precision runs the same kernel design over the same panel layout,
the smaller weights widened to fp32 in registers and summed in fp32: the speed difference is the bytes read.
On "Why is the sky blue?" (chat, 24 tokens, the 2-core build machine): fp32 39.9 tok/s, bf16 58.2, int8 91.6;
bf16 flips no token, int8 2 of 24. Without it, torch's bf16 linear (oneDNN) and `_weight_int8pack_mm`, which on
a CPU without native bf16 or tuned int8 instructions are slower than fp32 (int8 3.5 tok/s against fp32's 10).

Each variant is fed the prompt and then fp32's greedy answer token by token (teacher forcing: every variant sees
the same context at every step), so the logits are compared position by position: the largest absolute logit
difference, and at how many positions of the answer the variant's own greedy choice would differ. Norms,
RoPE, attention and the embedding stay fp32 in every variant. Nothing here changes what the app serves: fp32
stays the default everywhere.

An int8 model (`load_model(precision="int8")`) that served an answer is held beside fp32 the same way, by the one
comparison here (`differences`): `beside_fp32` feeds the prompt and the int8 model's answer through both models' own
forward (transformers) and compares each answer position's greedy choice and logits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.common.memo import give_back_freed_memory
from pipeline.decode_step.choice import CHOICE
from pipeline.decode_step.cpu.matmul import packed_panels, panel_product
from pipeline.decode_step.cpu.row_kv import BufferKV
from pipeline.decode_step.cpu.row_step import RowStep, usable
from pipeline.decode_step.fused import bucket
from pipeline.decode_step.fused_weights import fused_model
from pipeline.model.loaded import LoadedModel
from pipeline.model.quantised import quantise_rows
from pipeline.model.registry import split_precision

KINDS = ("fp32", "bf16", "int8")
PRECISION_NOTES = {"fp32": "fp32", "int8": "int8 weight-only (each matrix row in int8 with its own fp32 scale)"}
LABELS = {"fp32": "fp32 (default)", "bf16": "bf16", "int8": "int8 weight-only"}
N_NEW = 24  # answer tokens compared


def _bf16(w: torch.Tensor, b: torch.Tensor | None):
    wb = w.detach().to(torch.bfloat16)
    bb = None if b is None else b.detach().to(torch.bfloat16)
    if CHOICE.precision().c:  # pipeline/decode_step/cpu/cpu_decode.c: bf16 weights widened to fp32 in registers, fp32 sums
        p = packed_panels(wb.view(torch.int16).numpy().view(np.uint16))
        bias = None if bb is None else bb.float().contiguous().numpy()

        def project(x: np.ndarray) -> np.ndarray:
            xb = torch.from_numpy(x).to(torch.bfloat16).float().numpy()  # activations rounded to bf16 going in
            return panel_product(np.ascontiguousarray(xb), p, wb.shape[0], wb.shape[1], bias)

        return project, wb.numel() * 2

    def project(x: np.ndarray) -> np.ndarray:
        return F.linear(torch.from_numpy(x).to(torch.bfloat16), wb, bb).float().numpy()

    return project, wb.numel() * 2


def _int8(w: torch.Tensor, b: torch.Tensor | None):
    w8, scale = quantise_rows(w)  # the one quantiser, an int8 model's too (pipeline.model.quantised)
    if CHOICE.precision().c:  # pipeline/decode_step/cpu/cpu_decode.c: int8 weights widened to fp32 in registers, scaled per row
        p = packed_panels(w8.numpy())
        sc = scale.float().contiguous().numpy()
        bias = None if b is None else np.ascontiguousarray(b.detach().float().numpy())

        def project(x: np.ndarray) -> np.ndarray:
            return panel_product(np.ascontiguousarray(x, dtype=np.float32), p, w8.shape[0], w8.shape[1], bias, scale=sc)

        return project, w8.numel() + scale.numel() * 4

    def project(x: np.ndarray) -> np.ndarray:
        y = torch._weight_int8pack_mm(torch.from_numpy(x), w8, scale)
        return (y if b is None else y + b).numpy()

    return project, w8.numel() + scale.numel() * 4


def kernel_note() -> str:
    """What computed the lesson's products, for page 12's caption (the kernel choice's reason)."""
    return CHOICE.precision().reason


def served_note(lm: LoadedModel) -> str:
    """What computes `lm`'s engine passes for a decode token, in words: the kernel choice's reason for its precision."""
    return CHOICE.engine_pass(usable(lm), True, precision=lm.precision).reason


@dataclass(frozen=True)
class Differences:
    """Two sets of logits for the same positions, compared (`differences`): where their greedy choices differ and by
    how much the logits move."""

    positions: int
    differing: list[int]  # positions where the two greedy choices differ
    picks: list[int]  # the model's greedy choice at each position
    ref_picks: list[int]  # the reference's (fp32's)
    max_logit_diff: float  # largest |logit - reference logit| over every position and the whole vocabulary
    at: int  # the position of that largest difference
    per_position: list[float]  # the largest |difference| at each position


def differences(logits: torch.Tensor, ref: torch.Tensor) -> Differences:
    """logits and ref [positions, vocabulary] of the same positions: THE comparison of a precision with fp32 (the
    lesson's variants and an int8 model's answer)."""
    logits, ref = logits.float(), ref.float()
    picks, ref_picks = logits.argmax(-1).tolist(), ref.argmax(-1).tolist()
    gap = (logits - ref).abs().amax(-1) if len(ref) else torch.zeros(0)
    return Differences(
        len(ref),
        [i for i, (a, b) in enumerate(zip(picks, ref_picks)) if a != b],
        picks,
        ref_picks,
        float(gap.max()) if len(gap) else 0.0,
        int(gap.argmax()) if len(gap) else 0,
        gap.tolist(),
    )


def teacher_forced(lm: LoadedModel, prompt_ids: list[int], answer: list[int]) -> torch.Tensor:
    """`lm`'s own forward (transformers) over the prompt and the answer: the logits that choose each answer token,
    [len(answer), vocabulary] float32 on the CPU (position i sees the prompt and answer[:i])."""
    ids = torch.tensor([list(prompt_ids) + list(answer[:-1])], device=lm.device)
    with lm.lock, torch.inference_mode():
        return lm.model(input_ids=ids, use_cache=False, logits_to_keep=len(answer)).logits[0].float().cpu()


def beside_fp32(fp32: LoadedModel, served: LoadedModel, prompt_ids: list[int], answer: list[int]) -> Differences:
    """An answer `served` (an int8 model) gave, beside its fp32 model: both fed the prompt and that answer (teacher
    forcing, the same context at every position), each position's greedy choice and logits compared (`differences`,
    fp32 the reference)."""
    if not answer:
        raise ValueError("no answer tokens to compare")
    if fp32.precision != "fp32" or split_precision(served.key)[0] != fp32.key:
        raise ValueError(f"{fp32.label} is not the fp32 model of {served.label}")
    return differences(teacher_forced(served, prompt_ids, answer), teacher_forced(fp32, prompt_ids, answer))


def variant(lm: LoadedModel, kind: str) -> tuple[RowStep, int]:
    """A RowStep whose matrices are `kind` (its own copies; the model's fp32 weights are untouched), and the bytes
    of matrix weights one decode token reads."""
    step = RowStep(fused_model(lm))
    layers = [*step.layers, step.head]
    if kind == "fp32":
        return step, sum(w.numel() * 4 for ly in layers for w, _ in ly.t.values())
    make = {"bf16": _bf16, "int8": _int8}[kind]
    total = 0
    for ly in layers:
        ly.custom = {}
        for name, (w, b) in ly.t.items():
            ly.custom[name], n = make(w, b)
            total += n
    return step, total


@dataclass
class PrecisionRun:
    kind: str
    tokens_per_s: float  # decode steps over the answer, median step time
    step_ms: list[float]
    bytes_per_token: int  # weight bytes of the matrices read per decode token
    flips: int  # answer positions where this variant's greedy choice differs from fp32's token
    first_flip: int | None  # the first such position
    max_logit_diff: float  # largest |logit - fp32 logit| over the answer's positions
    positions: int
    max_diff_vs_forward: float = 0.0  # largest |logit - a plain transformers forward's| (the independent reference)


def compare(lm: LoadedModel, prompt_ids: list[int], n_new: int = 24, kinds=KINDS, progress=None) -> tuple[list[int], list[PrecisionRun]]:
    """fp32 answers greedily (n_new tokens); every variant is then fed the prompt and that answer one token at a
    time (see the module). Returns (fp32's answer, one run per kind)."""
    if not usable(lm):
        raise ValueError("The precision lesson runs the CPU row step: a CPU in fp32, with an architecture the fused step implements.")
    n_pos = bucket(len(prompt_ids) + n_new + 1, lm.facts.max_positions)
    f = lm.facts
    shape = (f.n_layers, f.n_kv_heads, n_pos, f.head_dim)
    total = len(kinds) * (len(prompt_ids) + n_new - 1)
    done = 0
    answer: list[int] = []
    ref, out = None, []
    for kind in kinds:
        step, nbytes = variant(lm, kind)
        kv = BufferKV(torch.zeros(shape), torch.zeros(shape))
        logits, times = [], []
        free = ref is None  # the first kind (fp32) answers for itself; the others follow its answer
        seq = list(prompt_ids)
        p = 0
        while p < len(prompt_ids) + n_new - 1:
            kv.pos = p
            t = time.perf_counter()
            with lm.lock:
                lg = step.logits([seq[p]], [p], kv)[0]
            if p >= len(prompt_ids) - 1:  # the logits that choose each answer token
                times.append(time.perf_counter() - t)
                logits.append(lg.clone())
                if free:
                    answer.append(int(lg.argmax()))
                seq.append(answer[len(logits) - 1])
            p += 1
            done += 1
            if progress:
                progress(done / total, f"{LABELS[kind]}: token {p} of {len(prompt_ids) + n_new - 1}")
        lg = torch.stack(logits)
        if ref is None:
            ref = lg
            with lm.lock, torch.inference_mode():  # transformers' own forward over the prompt and fp32's answer
                ids = torch.tensor([list(prompt_ids) + answer[:-1]], device=lm.device)
                forward = lm.model(input_ids=ids).logits[0, len(prompt_ids) - 1 :].float().cpu()
        d = differences(lg, ref)
        flips = d.differing  # fp32's greedy choice is its answer: the positions where this variant picks another token
        ms = sorted(t * 1000 for t in times[1:]) or [times[0] * 1000]
        out.append(
            PrecisionRun(
                kind,
                1000 / ms[len(ms) // 2],
                ms,
                nbytes,
                len(flips),
                flips[0] if flips else None,
                d.max_logit_diff,
                len(answer),
                float((lg - forward).abs().max()),
            )
        )
        del step
        give_back_freed_memory()  # the variant's bf16/int8 copies: ~0.4 GB a run that malloc would otherwise keep
    return answer, out
