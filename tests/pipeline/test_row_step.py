"""The CPU decode path (pipeline.decode_step.cpu.row_step, kernel_choice, matmul, cpu_threads, precision): the same tokens as transformers'
generate, each row its own whatever shares its pass, the kernels' accuracy, the thread plan's decisions."""

import numpy as np
import pytest
import torch

from pipeline.decode_step import choice as kernel_choice
from pipeline.decode_step import precision
from pipeline.decode_step.cpu import library, row_kv, row_step
from pipeline.decode_step.cpu import matmul as cpu_matmul
from pipeline.decode_step.cpu import threads as cpu_threads
from pipeline.decode_step.fused_weights import fused_model
from pipeline.engine import Engine
from pipeline.engine.paged import Seq
from pipeline.generation import generate, prepare
from pipeline.generation.events import StepEvent

PROMPTS = ["Why is the sky blue?", "The capital of France is", "Name 5 colours and one thing of each colour."]


@pytest.mark.model
def test_the_engines_lone_request_gives_transformers_greedy_tokens(lm):
    """A request alone in the engine decodes with the row step; its answer equals model.generate's, and so does
    our own loop's fused mode (the same step over a static buffer)."""
    assert row_step.row_step(fused_model(lm)) is not None
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


@pytest.fixture
def without_native(monkeypatch):
    """The fallback kernels (no C compiler, no AVX2): OpenBLAS, oneDNN, numpy and torch attention."""
    monkeypatch.setattr(library, "_lib", None)


def _alone_and_together(lm):
    """Decode-only passes of 1, 3, 12 and 2 rows of different lengths: [(row's logits in a group, alone)]."""
    eng = Engine(lm, background=False)
    step, pool = eng.step, eng.scheduler.pool
    lens = [20, 23, 31, 40, 9, 64, 17, 33, 25, 28, 30, 22]
    tables = [pool.take(pool.blocks_for(80)) for _ in lens]
    pairs = []
    with torch.inference_mode():
        for n, t in zip(lens, tables):
            step.forward([Seq(list(range(300, 300 + n)), 0, t)])
        alone = [step.forward([Seq([7], n, t)])[0] for n, t in zip(lens, tables)]
        for group in ([0, 1, 2], list(range(12)), [4, 5]):  # close lengths, and far apart
            out = step.forward([Seq([7], lens[j], tables[j]) for j in group])
            pairs += [(out[row], alone[j]) for row, j in enumerate(group)]
    return pairs


@pytest.mark.model
def test_a_row_gives_the_same_logits_alone_or_among_others(smol):
    """With pipeline/decode_step/cpu/cpu_decode.c every row's logits are bit for bit the same alone and among 2 or 11 others."""
    if not kernel_choice.CHOICE.c_kernels():
        pytest.skip("pipeline/decode_step/cpu/cpu_decode.c is not built on this machine (no C compiler or no AVX2/FMA)")
    for together, alone in _alone_and_together(smol):
        assert torch.equal(together, alone)


@pytest.mark.model
def test_without_the_native_kernels_a_row_stays_within_rounding(smol, without_native):
    """The fallback kernels (alone OpenBLAS, among others oneDNN; gathered or row-by-row attention): within 2e-4
    (logits of ~30: a relative 7e-6) and the same top token."""
    for together, alone in _alone_and_together(smol):
        assert (together - alone).abs().max() < 2e-4
        assert together.argmax() == alone.argmax()


def _paged(rng, D=16):
    K = torch.from_numpy(rng.standard_normal((2, 20, 3, 8, D)).astype(np.float32))
    V = torch.from_numpy(rng.standard_normal((2, 20, 3, 8, D)).astype(np.float32))
    return K, V, [[3, 7, 1], [5, 2, 9, 11], [0, 4, 6]], [17, 29, 20]


def _reference(K, V, table, pos, q, window, scale):
    """One row's attention in float64 from its positions gathered by hand: softmax(q K^T * scale) V."""
    ps = [p for p in range(pos + 1) if not window or p > pos - window]
    k = np.stack([K[table[p // 8], :, p % 8] for p in ps], 1).astype(np.float64)  # [KV, n, D]
    v = np.stack([V[table[p // 8], :, p % 8] for p in ps], 1).astype(np.float64)
    s = np.einsum("kgd,knd->kgn", q.astype(np.float64), k) * scale
    w = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("kgn,knd->kgd", w / w.sum(-1, keepdims=True), v).reshape(-1)


@pytest.mark.unit
@pytest.mark.parametrize("D", [16, 64, 72])
def test_native_attention_reads_each_rows_blocks_where_they_lie(D):
    if not kernel_choice.CHOICE.c_kernels():
        pytest.skip("pipeline/decode_step/cpu/cpu_decode.c is not built on this machine")
    rng = np.random.default_rng(0)
    K, V, tables, pos = _paged(rng, D)
    q = rng.standard_normal((3, 3, 2, D)).astype(np.float32)
    rows = row_kv.PagedRows(K, V, tables, pos)
    for window in (None, 5):
        a = rows.attend(1, q, window, np.float32(0.25))
        for b in range(3):
            ref = _reference(K[1].numpy(), V[1].numpy(), tables[b], pos[b], q[b], window, 0.25)
            assert np.abs(a[b] - ref).max() < 1e-5
            one = row_kv.PagedRows(K, V, [tables[b]], [pos[b]]).attend(1, q[b : b + 1], window, np.float32(0.25))
            assert np.array_equal(one[0], a[b])  # the same numbers alone
    # a static buffer [layers, KV, max_len, D] (our own loop's fused mode) is one block
    buf = row_kv.BufferKV(
        torch.from_numpy(rng.standard_normal((1, 3, 40, D)).astype(np.float32)), torch.from_numpy(rng.standard_normal((1, 3, 40, D)).astype(np.float32))
    )
    buf.pos = 30
    got = buf.attend(0, q[:1], 8, np.float32(0.25))[0]
    k, v = buf.K[0][:, 23:31].astype(np.float64), buf.V[0][:, 23:31].astype(np.float64)
    s = np.einsum("kgd,knd->kgn", q[0].astype(np.float64), k) * 0.25
    w = np.exp(s - s.max(-1, keepdims=True))
    assert np.abs(got - np.einsum("kgn,knd->kgd", w / w.sum(-1, keepdims=True), v).reshape(-1)).max() < 1e-5


@pytest.mark.unit
def test_fallback_gathered_attention_equals_attention_row_by_row(without_native):
    rng = np.random.default_rng(0)
    K, V, tables, pos = _paged(rng)
    q = rng.standard_normal((3, 3, 2, 16)).astype(np.float32)
    gathered = row_kv.PagedRows(K, V, tables, pos)
    assert gathered.gathered
    for window in (None, 5):
        a = gathered.attend(1, q, window, np.float32(0.25))
        for b in range(3):
            one = row_kv.PagedRows(K, V, [tables[b]], [pos[b]])
            assert not one.gathered
            assert np.allclose(a[b], one.attend(1, q[b : b + 1], window, np.float32(0.25))[0], atol=1e-5)
            ref = _reference(K[1].numpy(), V[1].numpy(), tables[b], pos[b], q[b], window, 0.25)
            assert np.abs(a[b] - ref).max() < 1e-5


def _kernels_against_float64():
    torch.manual_seed(0)
    w, b = torch.randn(384, 96) * 0.05, torch.randn(384)
    for rows in (1, 2, 3, 5, 7, 8, 13, 32, 64, 65, 128, 129):
        x = torch.randn(rows, 96)
        ref = x.double() @ w.double().t() + b.double()
        err = (cpu_matmul.linear(x, w, b).double() - ref).abs().max().item()
        base = (torch.nn.functional.linear(x, w, b).double() - ref).abs().max().item()
        assert err < 4 * base + 1e-6, rows
    return w, b


@pytest.mark.unit
def test_cpu_kernels_are_accurate_and_each_row_is_its_own():
    """The kernel the choice picks for each row count (1-64 pipeline/decode_step/cpu/cpu_decode.c, 65-128 W @ xT, above F.linear)
    against float64; a row gives the same numbers alone as among 31 others, bit for bit; odd sizes too."""
    w, b = _kernels_against_float64()
    if not kernel_choice.CHOICE.c_kernels():
        pytest.skip("pipeline/decode_step/cpu/cpu_decode.c is not built on this machine")
    x = torch.randn(32, 96)
    many = cpu_matmul.linear(x, w, b)
    for lo, hi in ((3, 4), (3, 5), (0, 6), (0, 7), (9, 17), (0, 32)):
        assert torch.equal(cpu_matmul.linear(x[lo:hi], w, b), many[lo:hi])
    assert isinstance(getattr(w, cpu_matmul._PANEL), np.ndarray)  # the panel copy is made once, kept on the weight
    # one row goes through 4 panels at once (cpu_decode.c's k1xG): the same sums in the same order, so the same bits
    # as the same row among others; 11 panels = 2 groups of 4 and 3 left one by one, with a bias
    w11, b11 = torch.randn(16 * 11, 200), torch.randn(16 * 11)
    rows = torch.randn(7, 200)
    together = cpu_matmul.linear(rows, w11, b11)
    for i in range(7):
        assert torch.equal(cpu_matmul.linear(rows[i : i + 1], w11, b11), together[i : i + 1])
    assert (together.double() - (rows.double() @ w11.double().t() + b11.double())).abs().max() < 1e-4
    odd = torch.randn(37, 29)  # outputs not a multiple of the 16-wide panel, inputs not of the 8-wide vector
    xo = torch.randn(5, 29)
    assert (cpu_matmul.linear(xo, odd).double() - xo.double() @ odd.double().t()).abs().max() < 1e-5


@pytest.mark.unit
def test_fallback_kernels_are_accurate_and_onednn_rows_are_their_own(without_native):
    w, _ = _kernels_against_float64()
    if kernel_choice.ONEDNN:
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
    # fp32 against an independent reference: transformers' own forward over the prompt and the answer
    assert len(answer) == 6 and fp32.max_diff_vs_forward < 1e-3, fp32.max_diff_vs_forward
    assert bf16.max_diff_vs_forward > 10 * fp32.max_diff_vs_forward and int8.max_diff_vs_forward > 10 * fp32.max_diff_vs_forward
    assert bf16.bytes_per_token * 2 == fp32.bytes_per_token
    assert fp32.bytes_per_token / 4 < int8.bytes_per_token < fp32.bytes_per_token / 3.9
    assert 0 < bf16.max_logit_diff < 5 and 0 < int8.max_logit_diff < 5
    assert all(r.tokens_per_s > 0 and r.positions == 6 for r in runs)
    # fp32's answer is the model's greedy answer
    assert answer == [e.token_id for e in generate(smol, "The capital of France is", 6, stop_ids=set())]


@pytest.mark.unit
def test_lower_precision_kernels_against_their_references():
    """Page 12's bf16 and int8 products through pipeline/decode_step/cpu/cpu_decode.c: against float64 of the same rounded weights
    (and int8 against torch's own int8 kernel), each row the same alone as among others."""
    if not kernel_choice.CHOICE.c_kernels():
        pytest.skip("pipeline/decode_step/cpu/cpu_decode.c is not built on this machine")
    torch.manual_seed(0)
    w, b = torch.randn(200, 96) * 0.05, torch.randn(200)
    x = torch.randn(5, 96).numpy()
    int8, nbytes = precision._int8(w, b)
    scale = (w.abs().amax(1) / 127).clamp_min(1e-12)
    w8 = torch.round(w / scale[:, None]).clamp(-127, 127)
    ref = x.astype(np.float64) @ (w8 * scale[:, None]).double().numpy().T + b.double().numpy()
    assert np.abs(int8(x) - ref).max() < 1e-5 and nbytes == 200 * 96 + 200 * 4
    torch_int8 = torch._weight_int8pack_mm(torch.from_numpy(x), w8.to(torch.int8), scale) + b
    assert np.abs(int8(x) - torch_int8.numpy()).max() < 1e-4
    bf16, nbytes = precision._bf16(w, None)
    ref = torch.from_numpy(x).bfloat16().double() @ w.bfloat16().double().t()
    assert np.abs(bf16(x) - ref.numpy()).max() < 1e-5 and nbytes == 200 * 96 * 2
    for f in (int8, bf16):
        assert np.array_equal(f(x[2:3])[0], f(x)[2])


@pytest.mark.unit
def test_panels_of_a_strided_weight_are_its_own():
    """A weight given as a transposed view is copied contiguous first, and that copy lives through the packing."""
    if not kernel_choice.CHOICE.c_kernels():
        pytest.skip("pipeline/decode_step/cpu/cpu_decode.c is not built on this machine")
    w = np.random.default_rng(1).standard_normal((64, 40)).astype(np.float32)
    assert np.array_equal(cpu_matmul.packed_panels(w.T.copy().T), cpu_matmul.packed_panels(w))
    strided = cpu_matmul.packed_panels(np.asfortranarray(w))
    assert np.array_equal(strided.reshape(-1, 40, 16)[0, :, 0], w[0])  # panel 0, output 0: W's first row, k by k
