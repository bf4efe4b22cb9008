"""GPU paths: run only where a CUDA device exists (skipped on CPU-only machines and in CI). What the GPU's generation
must hold is one check, `generation_problems`, which the unit tier drives on made-up events (it must catch each kind
of broken run) and the model tier on the CPU, so a check that cannot fail is caught without a GPU."""

from types import SimpleNamespace

import pytest
import torch

import pipeline
from pipeline.common.telemetry import Sampler
from pipeline.generation import Phase, generate, kv_bytes_formula, metrics

pytestmark = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
PROMPT = "The capital of France is"


def generation_problems(events: list, n: int, kv_formula) -> list[str]:
    """What is wrong with a generation asked for exactly `n` tokens (stop_ids=[]): empty when it holds. Its n events
    in order (the prefill first), time moving forward, the K/V bytes of each step equal to the formula at its context
    (`kv_formula(context_len)`), and a decode rate: a positive number of tokens per second."""
    bad = []
    if [e.index for e in events] != list(range(n)):
        bad.append(f"{len(events)} events, indexed {[e.index for e in events][:5]}…, for {n} tokens")
    if events and (events[0].phase != Phase.PREFILL or any(e.phase != Phase.DECODE for e in events[1:])):
        bad.append("not one prefill then decode steps")
    if any(b.t_s <= a.t_s for a, b in zip(events, events[1:])):
        bad.append("an event not later than the one before it")
    kv = [(e.context_len, e.kv_bytes, kv_formula(e.context_len)) for e in events if e.kv_bytes != kv_formula(e.context_len)]
    if kv:
        bad.append(f"K/V bytes off the formula at {len(kv)} steps (context, measured, formula: {kv[0]})")
    rate = metrics(events).tokens_per_s if events else None
    if rate is None or not rate > 0:
        bad.append(f"no decode rate ({rate})")
    return bad


def _events(n: int, per_token: int = 100, at: dict | None = None) -> list:
    """n made-up events of a well-formed run, 20 ms apart, then `at` (index -> fields) changed."""
    ev = [
        SimpleNamespace(
            index=i, phase=Phase.PREFILL if i == 0 else Phase.DECODE, t_s=0.1 + 0.02 * i, step_s=0.02, context_len=5 + i, kv_bytes=per_token * (5 + i)
        )
        for i in range(n)
    ]
    for i, fields in (at or {}).items():
        vars(ev[i]).update(fields)
    return ev


@pytest.mark.unit
def test_the_generation_check_holds_on_a_good_run_and_catches_each_broken_one():
    formula = lambda c: 100 * c  # noqa: E731
    assert generation_problems(_events(16), 16, formula) == []
    assert generation_problems(_events(1), 16, formula)  # stopped after its first token
    assert generation_problems(_events(16)[:15], 16, formula)  # one token short
    assert generation_problems(_events(16, at={3: {"phase": Phase.PREFILL}}), 16, formula)
    assert generation_problems(_events(16, at={5: {"kv_bytes": 0}}), 16, formula)  # the cache did not grow
    assert generation_problems(_events(16, per_token=200), 16, formula)  # twice the formula
    flat = _events(16, at={i: {"t_s": 0.1} for i in range(16)})  # every token at the same moment: no decode rate
    assert "no decode rate (None)" in generation_problems(flat, 16, formula)
    assert generation_problems([], 16, formula)


@pytest.mark.model
def test_the_generation_check_holds_on_the_cpu(smol):
    ev = list(generate(smol, PROMPT, 16, stop_ids=[]))
    assert generation_problems(ev, 16, lambda c: kv_bytes_formula(smol, c)) == []


@pytest.fixture(scope="module")
def gpu_lm():
    return pipeline.load_model(pipeline.EMBEDDED, device="cuda")


@needs_cuda
def test_gpu_trace_and_generate(gpu_lm):
    tr = pipeline.trace(gpu_lm, PROMPT)
    assert gpu_lm.tokenizer.decode([int(tr.next_logits.argmax())]) == " Paris"
    ev = list(generate(gpu_lm, PROMPT, 16, stop_ids=[]))  # exactly 16 tokens: a rate to check, whatever the model says
    assert generation_problems(ev, 16, lambda c: kv_bytes_formula(gpu_lm, c)) == []


@needs_cuda
def test_gpu_telemetry_uses_nvml(gpu_lm):
    with Sampler(interval_s=0.02) as s:
        list(generate(gpu_lm, PROMPT, 16))
    assert s.timeline.source == "nvml"
    assert "gpu_util" in s.timeline.samples[-1] and "torch_allocated_mb" in s.timeline.samples[-1]
