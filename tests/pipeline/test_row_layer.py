"""A Llama-family layer in one C call (cpu_decode.c's row_layer, row_step's default where it applies) against the same
step with a call per operation: the same logits within rounding and the same top token, for one request's buffer and
for 8 requests' paged blocks at different positions; every layer in one call (row_layers) bit for bit as a call a layer;
the rows' KV slots are checked before the kernel reads them."""

import numpy as np
import pytest
import torch

from pipeline.decode_step import fused
from pipeline.decode_step.choice import CHOICE
from pipeline.decode_step.cpu import layer_call, row_kv, row_step

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def step(smol):
    if not CHOICE.c_kernels():
        pytest.skip("pipeline/decode_step/cpu/cpu_decode.c is not built on this machine")
    st = row_step.row_step(fused.fused_model(smol))
    assert all(ly.whole() is not None for ly in st.layers), "SmolLM2's layers run as one call each"
    return st


def _both(fn):
    out = {}
    try:
        for flag in (True, False):
            row_step.WHOLE_LAYERS = flag
            out[flag] = fn()
    finally:
        row_step.WHOLE_LAYERS = True
    return out[True], out[False]


def test_one_request_in_its_buffer(step, smol):
    ids = smol.tokenizer("The capital of France is", return_tensors="pt").input_ids[0].tolist()

    def run():
        dec = fused.acquire_decoder(fused.fused_model(smol), 32)
        try:
            kv = row_kv.BufferKV(dec.K, dec.V)
            rows = []
            with torch.no_grad():
                for p, t in enumerate(ids):
                    kv.pos = p
                    rows.append(step.logits([t], [p], kv)[0].clone())
            return torch.stack(rows)
        finally:
            dec.release()

    whole, per_op = _both(run)
    assert (whole - per_op).abs().max() < 2e-4
    assert torch.equal(whole.argmax(-1), per_op.argmax(-1))
    with torch.no_grad():
        ref = smol.model(torch.tensor([ids])).logits[0].float()
    assert (whole - ref).abs().max() < 2e-4, "the model's own forward"


def test_eight_requests_in_paged_blocks(step):
    L, KV, D, bs = len(step.layers), step.KV, step.D, 16
    rng = np.random.default_rng(0)
    K = torch.from_numpy(rng.standard_normal((L, 64, KV, bs, D)).astype(np.float32) * 0.1)
    V = torch.from_numpy(rng.standard_normal((L, 64, KV, bs, D)).astype(np.float32) * 0.1)
    tables = [list(rng.permutation(64)[:8]) for _ in range(8)]  # blocks anywhere, shared by none
    pos = [3, 17, 40, 63, 90, 5, 127, 64]

    def run():
        k, v = K.clone(), V.clone()
        with torch.no_grad():
            out = step.run([5, 7, 11, 13, 17, 19, 23, 29], pos, row_kv.PagedRows(k, v, tables, pos)).logits
        return out, k

    (whole, k_whole), (per_op, k_per_op) = _both(run)
    # random keys and values (not a model's) carry RoPE's last-bit difference (the C call fuses a multiply-add the
    # numpy step rounds twice) through 30 layers: 8e-4 on logits of ~17, a relative 5e-5
    assert (whole - per_op).abs().max() < 2e-3
    assert torch.equal(whole.argmax(-1), per_op.argmax(-1))
    assert (k_whole - k_per_op).abs().max() < 1e-4, "the keys written where each row's position lies"


@pytest.mark.parametrize("n", [1, 3, 8])
def test_every_layer_in_one_call_equals_a_call_a_layer(step, n, monkeypatch):
    """row_layers (a pass nothing interrupts) against row_layer per layer (what a pass that may park runs): the same
    logits and the same keys and values, bit for bit."""
    assert step.stack() is not None, "SmolLM2's layers stack"
    L, KV, D, bs = len(step.layers), step.KV, step.D, 16
    rng = np.random.default_rng(n)
    K0 = torch.from_numpy(rng.standard_normal((L, 32, KV, bs, D)).astype(np.float32) * 0.1)
    tables = [list(rng.permutation(32)[:4]) for _ in range(n)]
    pos = [int(p) for p in rng.integers(0, 64, n)]
    calls = []

    def run(interrupt, want=None):
        k, v = K0.clone(), K0.clone() * 0.5
        with torch.no_grad():
            out = step.run(list(range(5, 5 + n)), pos, row_kv.PagedRows(k, v, tables, pos), interrupt=interrupt, want=want).logits
        return out, k, v

    one = run(None)
    # the final norm and LM head inside the same call, for the rows asked (the last, as a prompt chunk's pass asks)
    last = run(None, want=[n - 1])
    assert last[0].shape == (1, step.vocab) and torch.equal(last[0][0], one[0][n - 1])
    assert run(None, want=[])[0] is None
    asked = run(lambda: calls.append(1) or False)  # may park, but a pass of at most ONE_CALL_ROWS rows: one call
    assert len(calls) == 1, "asked once, before the call"
    monkeypatch.setattr(row_step, "ONE_CALL_ROWS", 0)
    per_layer = run(lambda: calls.append(1) or False)  # a call a layer, asked after each but the last
    assert len(calls) == 1 + L - 1
    for a, b, c in zip(one, asked, per_layer):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_rows_outside_the_kv_memory_are_refused(step):
    K = np.zeros((len(step.layers), 4, step.KV, 16, step.D), dtype=np.float32)
    table = np.zeros((1, 2), dtype=np.int32)
    with pytest.raises(ValueError, match="outside"):
        layer_call.LayerRows(K, K.copy(), [4], [0], table, [1], 16)  # block 4 of 4
    with pytest.raises(ValueError, match="outside"):
        layer_call.LayerRows(K, K.copy(), [0], [0], table, [33], 16)  # position 32 past 2 blocks of 16
    rows = layer_call.LayerRows(K, K.copy(), [0], [0], table, [1], 16)
    x = np.zeros((2, step.layers[0].whole().d), dtype=np.float32)
    with pytest.raises(ValueError, match="shape"):
        layer_call.row_layer(0, x, step.layers[0].whole(), rows, np.zeros((1, step.D), np.float32), np.zeros((1, step.D), np.float32), None, 0.125)
    x1, cs = np.zeros((1, x.shape[1]), dtype=np.float32), np.zeros((1, step.D), np.float32)
    with pytest.raises(ValueError, match="keep"):
        layer_call.row_layers(x1, step.stack(), rows, cs, cs.copy(), 0.125, head=step.head_call(), keep=[1])  # row 1 of 1
