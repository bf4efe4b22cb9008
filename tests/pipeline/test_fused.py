"""Production-mode decode (pipeline.decode_step.fused): our static-shape step against plain transformers forwards, on the
real models and on small seeded models of every architecture it claims, sliding windows included."""

import threading

import pytest
import torch

from pipeline.decode_step.fused import FusedDecoder, FusedUnsupported, acquire_decoder, bucket, fused_model, linear, supported
from pipeline.decode_step.fused_measures import check_against_forward, launches_per_step
from pipeline.forward.sampling import Sampling
from pipeline.generation import Runner, generate
from pipeline.model import LoadedModel, facts_of

pytestmark = pytest.mark.model


def tiny(model_type: str, seed: int = 0, **extra) -> LoadedModel:
    """A 3-layer model of the given architecture with seeded random weights (no tokenizer)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    kw = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        vocab_size=300,
        max_position_embeddings=512,
    )
    kw.update(extra)
    cfg = AutoConfig.for_model(model_type, **kw)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    return LoadedModel(
        key=model_type,
        label=f"tiny {model_type}",
        model=model,
        tokenizer=None,
        facts=facts_of(model),
        device=torch.device("cpu"),
        dtype=torch.float32,
        source="",
        load_seconds=0.0,
    )


ARCHS = {
    "llama": {},
    "qwen2": dict(
        use_sliding_window=True, sliding_window=8, max_window_layers=1, layer_types=["full_attention", "sliding_attention", "sliding_attention"]
    ),  # biases on q/k/v
    "qwen3": {},  # q/k norms
    "mistral": dict(sliding_window=8),
    "gemma3_text": dict(sliding_window=8, query_pre_attn_scalar=16, layer_types=["sliding_attention", "sliding_attention", "full_attention"]),
}


@pytest.mark.parametrize("arch", ARCHS)
def test_fused_step_equals_a_plain_forward(arch):
    lm = tiny(arch, **ARCHS[arch])
    assert supported(lm)[0]
    ids = torch.randint(0, 300, (40,), generator=torch.Generator().manual_seed(1)).tolist()  # > the window
    r = check_against_forward(lm, ids)
    assert r.max_rel_err < 1e-4 and r.same_argmax, r


@pytest.mark.unit
def test_fused_weights_are_views_of_the_model_parameters():
    lm = tiny("llama")
    before = sum(p.numel() for p in lm.model.parameters())
    ref = lm.model(torch.tensor([[1, 2, 3]])).logits
    dec = FusedDecoder(fused_model(lm), 256, graph=False)
    a = lm.model.model.layers[0].self_attn
    assert a.k_proj.weight.untyped_storage().data_ptr() == dec.layers[0].wqkv.untyped_storage().data_ptr()
    assert sum(p.numel() for p in lm.model.parameters()) == before
    assert torch.equal(lm.model(torch.tensor([[1, 2, 3]])).logits, ref)  # the model computes the same


@pytest.mark.unit
def test_unsupported_architecture_says_why():
    lm = tiny("gpt2", n_embd=64, n_layer=2, n_head=4, vocab_size=300, n_positions=128)
    ok, why = supported(lm)
    assert not ok and "gpt2" in why
    with pytest.raises(FusedUnsupported):
        FusedDecoder(fused_model(lm), 256, graph=False)


@pytest.mark.model  # compiles a (tiny) model: tens of seconds, so not in the unit tier
def test_torch_compile_of_the_step_traces_whole_and_agrees():
    """fullgraph=True: the step has no graph breaks and no host syncs, which is what CUDA-graph capture needs."""
    lm = tiny("llama", num_hidden_layers=2)
    eager, comp = FusedDecoder(fused_model(lm), 256, graph=False), FusedDecoder(fused_model(lm), 256, graph=False, compile=True)
    ids = torch.tensor([[5, 6, 7, 8]])
    for d in (eager, comp):
        d.prefill(ids)
    for pos, t in enumerate([9, 10, 11], start=4):
        a, b = eager.step(t, pos)[0], comp.step(t, pos)[0]
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-4)
    assert comp.mode.startswith("torch.compile")


@pytest.mark.unit
def test_the_tall_weight_layout_is_as_accurate_as_f_linear():
    """fused.linear (W @ xT on a CPU, 9-15 rows padded to 16) against a float64 reference, at every row count the
    engine meets: its error is F.linear's order, each row its own (no row leaks into another), bias included."""
    torch.manual_seed(0)
    w, b = torch.randn(384, 96) * 0.05, torch.randn(384)
    for rows in [1, 2, 3, 4, 5, 7, 8, 9, 11, 12, 15, 16, 17, 36, 128, 129]:
        x = torch.randn(rows, 1, 96)
        ref = x.double() @ w.double().t() + b.double()
        got = linear(x, w, b)
        assert got.shape == (rows, 1, 384)
        err, base = (got.double() - ref).abs().max().item(), (torch.nn.functional.linear(x, w, b).double() - ref).abs().max().item()
        assert err < 4 * base + 1e-6, (rows, err, base)
        alone = torch.cat([linear(x[i : i + 1], w, b) for i in range(rows)])
        assert torch.allclose(got, alone, atol=1e-5, rtol=0), rows


@pytest.mark.unit
def test_bucket_sizes():
    assert bucket(1) == 256 and bucket(257) == 512 and bucket(3000, 2048) == 2048


def test_fused_generation_gives_the_same_tokens(lm):
    prompt = "The capital of France is"
    a = list(generate(lm, prompt, 16, cache="dynamic"))
    b = list(generate(lm, prompt, 16, cache="fused"))
    assert [e.token_id for e in a] == [e.token_id for e in b]
    for x, y in zip(a, b):  # what the page shows per step, from the device summary
        assert [t for t, _, _ in x.top_raw] == [t for t, _, _ in y.top_raw]
        assert abs(x.p_raw - y.p_raw) < 1e-4 and y.p == 1.0
    # kv_bytes means the same on both paths (the context's keys and values); the fused step's buffer is set aside whole
    assert [x.kv_bytes for x in a] == [y.kv_bytes for y in b]
    assert b[0].kv_reserved_bytes == b[-1].kv_reserved_bytes > b[-1].kv_bytes
    assert a[0].engine is Runner.TRANSFORMERS and b[0].engine is Runner.FUSED_ROW_STEP and not b[0].problems
    r = check_against_forward(lm, lm.tokenizer("Why is the sky blue? Because")["input_ids"])
    assert r.max_rel_err < 1e-4 and r.same_argmax


def test_fused_sampling_matches_the_dynamic_loop(smol):
    kw = dict(sampling=Sampling(temperature=0.9, top_k=40, top_p=0.95, seed=3))
    a = [e.token_id for e in generate(smol, "Once upon a time", 16, **kw)]
    b = [e.token_id for e in generate(smol, "Once upon a time", 16, cache="fused", **kw)]
    assert a == b


def test_concurrent_generations_never_share_buffers(smol):
    d1 = acquire_decoder(fused_model(smol), 40)
    d2 = acquire_decoder(fused_model(smol), 40)
    assert d1 is not d2
    d1.release()
    assert acquire_decoder(fused_model(smol), 40) is d1
    d1.release(), d2.release()
    out, errs = {}, []

    def run(name, prompt):
        try:
            out[name] = [e.token_id for e in generate(smol, prompt, 12, cache="fused")]
        except Exception as e:  # noqa: BLE001 - surfaced below
            errs.append(e)

    ts = [threading.Thread(target=run, args=(p, p)) for p in ("Dog bites man", "The capital of France is")]
    [t.start() for t in ts]
    [t.join() for t in ts]
    assert not errs
    for p in out:
        assert out[p] == [e.token_id for e in generate(smol, p, 12)]


def test_launch_counts(smol):
    r = launches_per_step(smol)
    assert r.ops["transformers"] > r.compute_ops["transformers"] > 30 * 7  # >= 7 matmuls per layer
    assert 30 * 4 < r.compute_ops["fused"] < r.compute_ops["transformers"]  # 4 matmuls per layer


@pytest.mark.unit
def test_a_failed_compile_falls_back_to_the_same_step(monkeypatch):
    lm = tiny("llama", num_hidden_layers=1)

    def broken(*a, **k):
        raise RuntimeError("no C++ compiler here")

    monkeypatch.setattr(torch, "compile", broken)
    dec = FusedDecoder(fused_model(lm), 256, graph=False, compile=True)
    assert dec.mode == "CPU row step" and "torch.compile failed" in dec.problems[0] and "no C++ compiler" in dec.problems[0]
    ref = FusedDecoder(fused_model(lm), 256, graph=False)
    ids = torch.tensor([[3, 4, 5]])
    dec.prefill(ids), ref.prefill(ids)
    assert torch.equal(dec.step(6, 3)[0], ref.step(6, 3)[0])
