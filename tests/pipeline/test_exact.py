"""Exact whatever shares the server (issue 34): with pipeline/decode_step/cpu/cpu_decode.c every pass of the CPU engine goes through
the row step, whose sums run in the same order for any number of rows, so a request's logits at every step are bit
for bit the same as the request served alone: among other requests' decode rows and prompt chunks, parked and
resumed for a newcomer, with its prompt from the prefix cache, while others are cancelled."""

import random
import sys
from pathlib import Path

import pytest
import torch

from pipeline.decode_step.choice import CHOICE
from pipeline.decode_step.cpu import row_step
from pipeline.engine import Engine
from pipeline.generation import long_prompt, prepare

sys.path.insert(0, str(Path(__file__).parent))
from engine_record import recording  # noqa: E402

pytestmark = pytest.mark.model

TEXTS = ["The capital of France is", "Why is the sky blue?", "Dog bites man.", "Man bites dog.", "Alice, Bob, Charlie and Diana each ordered"]


def _drain(eng):
    while eng.iterate() is not None:
        pass


def _alone(lm, prompt: list[int], n: int) -> list[torch.Tensor]:
    """The request served by itself, on a fresh engine without a prefix cache."""
    eng = Engine(lm, kv_pool_bytes=32 << 20, prefix_cache=False, background=False)
    seen = recording(eng)
    h = eng.submit(prompt, n, stop_ids=frozenset())
    _drain(eng)
    return seen[h.request.id]


@pytest.mark.parametrize("seed", [1, 2])
def test_every_step_of_every_request_is_bit_for_bit_the_request_alone(lm, seed, monkeypatch):
    if not CHOICE.c_kernels():
        pytest.skip("pipeline/decode_step/cpu/cpu_decode.c is not built on this machine: the torch passes sum in other orders")
    # one-row passes run every layer in one call (row_layers); passes of more rows a call a layer, so they can park
    monkeypatch.setattr(row_step, "ONE_CALL_ROWS", 1)
    rng = random.Random(seed)
    # chat prompts share the template's system turn (prefix-cache hits); one prompt is asked twice (a full hit); long
    # prompts of random lengths go in chunks beside the others' decode rows
    jobs = [prepare(lm, t, 1, chat=rng.random() < 0.6).prompt_ids for t in rng.sample(TEXTS, 4)]
    jobs += [prepare(lm, long_prompt(lm, rng.randint(70, 200)), 1, chat=False).prompt_ids for _ in range(2)]
    rng.shuffle(jobs)
    n_new = [rng.randint(3, 9) for _ in jobs]
    eng = Engine(lm, kv_pool_bytes=32 << 20, block_size=8, request_chunk=64, prefill_chunk=96, prefix_cache=True, background=False)
    seen = recording(eng)
    handles, waiting = [], list(zip(jobs, n_new))
    # some arrive between passes, some during one (asked after a layer: the parkable rows stop there for them)
    real = eng.newcomer_waiting

    def arrivals_mid_pass():
        if waiting and rng.random() < 0.15:
            handles.append(eng.submit(*waiting.pop(0), stop_ids=frozenset()))
        return real()

    eng.newcomer_waiting = arrivals_mid_pass
    forward, parked = eng.step.forward, []

    def counting(seqs, **kw):
        out = forward(seqs, **kw)
        parked.extend(s for s in seqs if s.parked)
        return out

    eng.step.forward = counting
    cancelled = set()
    longest = max(range(len(jobs)), key=lambda j: len(jobs[j]))
    again = (list(jobs[longest]), 4)  # asked again once its first answer began: its prompt's blocks come from the cache
    for _ in range(400):
        if waiting and rng.random() < 0.4:
            handles.append(eng.submit(*waiting.pop(0), stop_ids=frozenset()))
        if again and len(handles) > longest and handles[longest].request.first_token_at is not None:
            waiting.append(again)
            again = None
        if len(handles) > 2 and not cancelled and rng.random() < 0.1:
            victim = rng.choice([h for j, h in enumerate(handles[:-1]) if j != longest])
            victim.cancel()
            cancelled.add(victim.request.id)
        if eng.iterate() is None and not waiting:
            break
    _drain(eng)
    assert not waiting and len(handles) == len(jobs) + 1
    assert any(r.prefill and r.decode for r in eng.records), "no pass mixed a prompt with decode rows"
    assert sum(h.request.cached for h in handles) > 0, "no prompt came from the prefix cache"
    assert parked, "no row was parked and resumed"
    differing = 0
    for h in handles:
        got = seen.get(h.request.id, [])
        want = _alone(lm, h.request.prompt_ids, h.request.max_new_tokens)
        if h.request.id not in cancelled:
            assert len(got) == len(want), h.request.id
        assert len(got) <= len(want)
        differing += sum(int((a != b).sum()) for a, b in zip(got, want))
    assert differing == 0, f"{differing} logits differ from the requests served alone"
