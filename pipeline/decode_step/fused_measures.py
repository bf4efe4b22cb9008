"""What the production page measures of the fused step (pipeline.decode_step.fused): its logits against a plain transformers
forward (check_against_forward), what one step asks of the host (launches_per_step), the device's time per token
with nothing else in the loop (step_floor), and how it runs on this device (mode_label, from pipeline.decode_step.choice).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from pipeline.common.timing import ids_of_length, syncer
from pipeline.decode_step.choice import CHOICE
from pipeline.decode_step.cpu.row_step import usable
from pipeline.decode_step.fused import FusedDecoder, acquire_decoder, bucket
from pipeline.decode_step.fused_weights import fused_model
from pipeline.model.loaded import LoadedModel

# operators that only make a new view of existing memory (no kernel on a GPU)
VIEW_OPS = {
    "aten::view",
    "aten::reshape",
    "aten::slice",
    "aten::select",
    "aten::split",
    "aten::split_with_sizes",
    "aten::chunk",
    "aten::t",
    "aten::transpose",
    "aten::unsqueeze",
    "aten::squeeze",
    "aten::expand",
    "aten::as_strided",
    "aten::detach",
    "aten::alias",
    "aten::_unsafe_view",
    "aten::narrow",
    "aten::permute",
    "aten::lift_fresh",
    "aten::unbind",
}


@dataclass
class ForwardCheck:
    """Our step fed token by token vs one plain transformers forward over the same ids."""

    max_rel_err: float  # max over positions of |ours - reference| / |reference| (logit vectors, L2)
    same_argmax: bool  # the same top token at every position
    positions: int


@dataclass
class StepCounts:
    """What one decode step dispatches from the host, per engine ("transformers", "fused", "fused+compile", and where
    "fused" is the trimmed Triton step, "fused (torch step)")."""

    ops: dict[str, int]  # top-level aten operators
    compute_ops: dict[str, int]  # of which do work (not views)
    kernels: dict[str, int] | None  # CUDA kernels launched (None on a CPU)


@dataclass
class StepFloor:
    """The fused step replayed back to back, the next token fed on the device: the device's time per token."""

    mode: str
    step_ms: float
    tokens_per_s: float
    steps: int


def check_against_forward(lm: LoadedModel, ids: list[int], max_len: int | None = None) -> ForwardCheck:
    """Feed `ids` through prefill(first token) + our step for each further token, and compare every
    position's logits with one plain transformers forward over the whole sequence. Eager (no graph)."""
    dev = lm.device
    x = torch.tensor([ids], device=dev)
    dec = FusedDecoder(fused_model(lm), max_len or bucket(len(ids) + 1, lm.facts.max_positions), graph=False)
    with lm.lock, torch.inference_mode():
        ref = lm.model(input_ids=x, use_cache=False).logits[0].float()
        ours = [dec.prefill(x[:, :1])[0]]
        for t in range(1, len(ids)):
            ours.append(dec.step(ids[t], t)[0].clone())
        ours = torch.stack(ours)
    err = ((ours - ref).norm(dim=-1) / ref.norm(dim=-1)).max().item()
    same_argmax = bool((ours.argmax(-1) == ref.argmax(-1)).all())
    return ForwardCheck(err, same_argmax, len(ids))


def launches_per_step(lm: LoadedModel, context: int = 32, compile: bool = False) -> StepCounts:
    """What one decode step costs the host: operators dispatched from Python (and on CUDA, kernels launched)
    by transformers' forward with a dynamic cache, by our fused step, and with compile=True by the fused step
    after torch.compile; counted by torch.profiler on one step each, run without a graph. On a GPU every
    operator is at least one launch of a few microseconds of CPU time; a CUDA graph replays all of a step's
    kernels with one launch."""
    from torch.profiler import ProfilerActivity, profile
    from transformers import DynamicCache

    cuda = lm.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync = syncer(lm.device)
    ids = ids_of_length(lm, context)

    def count(fn):
        fn()  # warm
        sync()
        with profile(activities=acts) as prof:
            fn()
            sync()
        evs = prof.events()
        top = [e for e in evs if e.name.startswith("aten::") and not (e.cpu_parent is not None and e.cpu_parent.name.startswith("aten::"))]
        compute = [e for e in top if e.name not in VIEW_OPS and not (e.name == "aten::to" and not e.cpu_children)]
        kernels = sum(1 for e in evs if str(getattr(e, "device_type", "")).endswith("CUDA"))
        return len(top), len(compute), kernels

    out = {}
    with lm.lock, torch.inference_mode():
        cache = DynamicCache(config=lm.model.config)
        lm.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
        out["transformers"] = count(lambda: lm.model(input_ids=ids[:, -1:], past_key_values=cache, use_cache=True, logits_to_keep=1))
    variants = (("fused", False, None),) + ((("fused+compile", True, None),) if compile else ())
    if CHOICE.trimmed_step(fused_model(lm)) is None:  # "fused" is the trimmed Triton step: the torch step's beside it
        variants += (("fused (torch step)", False, False),)
    for name, comp, trimmed in variants:
        dec = acquire_decoder(fused_model(lm), context + 2, compile=comp, trimmed=trimmed)
        try:
            with lm.lock, torch.inference_mode():
                dec.prefill(ids)
                dec.tok.fill_(int(ids[0, -1]))
                dec.pos.fill_(context)
                out[name] = count(dec._run)  # the step's own launches, outside any graph
        finally:
            dec.release()
    return StepCounts({k: v[0] for k, v in out.items()}, {k: v[1] for k, v in out.items()}, {k: v[2] for k, v in out.items()} if cuda else None)


def mode_label(lm: LoadedModel, compile: bool = False) -> str:
    """How the fused step runs on this model's device (the kernel choice's reason)."""
    return CHOICE.fused_step(lm, usable(lm), compile).reason


def step_floor(lm: LoadedModel, steps: int = 200, context: int = 32, compile: bool = False, trimmed: bool | None = None) -> StepFloor:
    """The fused step alone, back to back, with the next token fed on the device (no host round trip per
    token): what the device needs per token, against which a generation loop's extra time is host work.
    Device-synchronised once at the end; returns ms per step and tokens/s. context + steps <= 245 stays in the
    smallest buffer, the one (and the graph) a short request uses."""
    sync = syncer(lm.device)
    dec = acquire_decoder(fused_model(lm), context + steps + 8, compile=compile, trimmed=trimmed)
    try:
        ids = ids_of_length(lm, context)
        with lm.lock, torch.inference_mode():
            _, summary = dec.prefill(ids)
            tok = summary.token
            for p in range(context, context + 3):  # warm
                _, summary = dec.step(tok, p)
            sync()
            t = time.perf_counter()
            for p in range(context + 3, context + 3 + steps):
                dec.pos.fill_(p)
                dec.tok.copy_(summary.argmax.view(1))  # argmax of the last step, on device
                if dec.graph is not None:
                    dec.graph.replay()
                else:
                    _, summary = dec._run()
            sync()
            s = (time.perf_counter() - t) / steps
    finally:
        dec.release()
    return StepFloor(dec.mode, s * 1000, 1 / s, steps)
