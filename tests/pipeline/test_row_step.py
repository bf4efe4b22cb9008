"""The CPU decode path (pipeline.row_step, cpu_matmul, cpu_threads, precision): the same tokens as transformers'
generate, each row its own whatever shares its pass, the kernels' accuracy, the thread plan's decisions."""

import numpy as np
import pytest
import torch

from pipeline import cpu_matmul, cpu_threads, precision, row_step
from pipeline.engine import Engine
from pipeline.engine.paged import Seq
from pipeline.events import StepEvent
from pipeline.generation import generate, prepare

PROMPTS = ["Why is the sky blue?", "The capital of France is", "Name 5 colours and one thing of each colour."]


@pytest.mark.model
def test_the_engines_lone_request_gives_transformers_greedy_tokens(lm):
    """A request alone in the engine decodes with the row step; its answer equals model.generate's, and so does
    our own loop's fused mode (the same step over a static buffer)."""
    assert row_step.row_step(lm) is not None
    eng = Engine(lm, background=False)
    for text in PROMPTS:
        req = prepare(lm, text, 24, chat=True)
        ids = torch.tensor([req.prompt_ids])
        with torch.inference_mode():
            ref = lm.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, min_new_tokens=24, do_sample=False)[0, ids.shape[1] :]
        h = eng.submit(req.prompt_ids, 24, stop_ids=set())
        while eng.iterate() is not None:
            pass
        got = [e.token_id for e in h if isinstance(e, StepEvent)]
        fused = [e.token_id for e in generate(lm, "", request=req, cache="fused", stop_ids=set())]
        assert got == fused == ref.tolist(), text


@pytest.mark.model
def test_a_row_gives_the_same_logits_alone_or_among_others(smol):
    """Decode-only passes of 1, 3 and 12 rows of different lengths (gathered and row-by-row attention): every row's
    logits within 2e-4 of the same row alone (logits of ~30: a relative 7e-6; alone the products are OpenBLAS's,
    among others oneDNN's), the same top token."""
    eng = Engine(smol, background=False)
    step, pool = eng.step, eng.scheduler.pool
    lens = [20, 23, 31, 40, 9, 64, 17, 33, 25, 28, 30, 22]
    tables = [pool.take(pool.blocks_for(80)) for _ in lens]
    with torch.inference_mode():
        for n, t in zip(lens, tables):
            step.forward([Seq(list(range(300, 300 + n)), 0, t)])
        alone = [step.forward([Seq([7], n, t)]) for n, t in zip(lens, tables)]
        for group in ([0, 1, 2], list(range(12)), [4, 5]):  # close lengths (gathered), and far apart (row by row)
            out = step.forward([Seq([7], lens[j], tables[j]) for j in group])
            for row, j in enumerate(group):
                assert (out[row] - alone[j][0]).abs().max() < 2e-4
                assert out[row].argmax() == alone[j][0].argmax()


@pytest.mark.unit
def test_gathered_attention_equals_attention_row_by_row():
    rng = np.random.default_rng(0)
    K = torch.from_numpy(rng.standard_normal((2, 20, 3, 8, 16)).astype(np.float32))
    V = torch.from_numpy(rng.standard_normal((2, 20, 3, 8, 16)).astype(np.float32))
    tables, pos = [[3, 7, 1], [5, 2, 9, 11], [0, 4, 6]], [17, 29, 20]
    q = rng.standard_normal((3, 3, 2, 16)).astype(np.float32)
    gathered = row_step.PagedRows(K, V, tables, pos)
    assert gathered.gathered
    for window in (None, 5):
        a = gathered.attend(1, q, window, np.float32(0.25))
        for b in range(3):
            one = row_step.PagedRows(K, V, [tables[b]], [pos[b]])
            assert not one.gathered
            assert np.allclose(a[b], one.attend(1, q[b : b + 1], window, np.float32(0.25))[0], atol=1e-5)


@pytest.mark.unit
def test_cpu_kernels_are_accurate_and_each_row_is_its_own():
    """Every kernel cpu_matmul picks (1 row OpenBLAS, 2-64 oneDNN packed, 65-128 W @ xT, above F.linear) against
    float64; a row through oneDNN gives the same numbers alone as among 31 others."""
    torch.manual_seed(0)
    w, b = torch.randn(384, 96) * 0.05, torch.randn(384)
    for rows in (1, 2, 8, 32, 64, 65, 128, 129):
        x = torch.randn(rows, 96)
        ref = x.double() @ w.double().t() + b.double()
        err = (cpu_matmul.linear(x, w, b).double() - ref).abs().max().item()
        base = (torch.nn.functional.linear(x, w, b).double() - ref).abs().max().item()
        assert err < 4 * base + 1e-6, rows
    if cpu_matmul.ONEDNN:
        x = torch.randn(32, 96)
        many = cpu_matmul.linear(x, w)
        assert torch.equal(cpu_matmul.linear(x[3:5], w), many[3:5])
        assert hasattr(w, cpu_matmul._PACKED)  # packed once, kept on the weight


@pytest.mark.unit
def test_the_thread_plan_drops_to_one_thread_when_starved_and_probes_back(monkeypatch):
    plan = cpu_threads.ThreadPlan(most=2)
    clock = {"wall": 0.0, "cpu": 0.0}
    monkeypatch.setattr(cpu_threads.time, "perf_counter", lambda: clock["wall"])
    monkeypatch.setattr(cpu_threads.time, "process_time", lambda: clock["cpu"])
    monkeypatch.setattr(cpu_threads, "ADAPTIVE", True)

    def step(share):
        with plan.step() as k:
            clock["wall"] += 0.05
            clock["cpu"] += 0.05 * share * k
        return k

    assert step(0.95) == 2 and plan.threads == 2  # got both cores
    assert step(0.4) == 2 and plan.threads == 1  # starved: the next steps run on one thread
    assert all(step(1.0) == 1 for _ in range(cpu_threads.PROBE_EVERY))
    assert step(0.9) == 2 and plan.threads == 2  # the probe got its share: back to both
    assert torch.get_num_threads() >= 1


@pytest.mark.model
def test_lower_precision_lesson(smol):
    ids = prepare(smol, "The capital of France is", 8).prompt_ids
    answer, runs = precision.compare(smol, ids, 6)
    fp32, bf16, int8 = runs
    assert len(answer) == 6 and fp32.flips == 0 and fp32.max_logit_diff == 0.0
    assert bf16.bytes_per_token * 2 == fp32.bytes_per_token
    assert fp32.bytes_per_token / 4 < int8.bytes_per_token < fp32.bytes_per_token / 3.9
    assert 0 < bf16.max_logit_diff < 5 and 0 < int8.max_logit_diff < 5
    assert all(r.tokens_per_s > 0 and r.positions == 6 for r in runs)
    # fp32's answer is the model's greedy answer
    assert answer == [e.token_id for e in generate(smol, "The capital of France is", 6, stop_ids=set())]
