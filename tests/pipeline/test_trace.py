import threading

import numpy as np
import pytest
import torch

import pipeline
from pipeline.forward.tracing import TraceError, lens_grid
from pipeline.lab import checks

pytestmark = pytest.mark.model


def test_trace_shapes_and_first_token(lm):
    tr = pipeline.trace(lm, "The capital of France is")
    f = lm.facts
    T = tr.T
    acts = tr.acts
    assert acts["hook_embed"].shape == (T, f.d_model)
    assert acts["blocks.*.hook_resid_pre"].shape == (f.n_layers + 1, T, f.d_model)
    pattern = acts["blocks.*.attn.hook_pattern"]
    assert pattern.shape == (f.n_layers, f.n_heads, T, T) and pattern.dtype == np.float16
    assert tr.next_logits.shape == (f.vocab,) and tr.next_logits.dtype == np.float32
    assert acts["blocks.*.hook_attn_out|norm"].shape == acts["blocks.*.hook_mlp_out|norm"].shape == (f.n_layers, T)
    assert len(tr.lens_last_top) == f.n_layers + 1
    assert acts.layers("blocks.*.attn.hook_q") == list(range(f.n_layers))
    assert acts["blocks.0.attn.hook_q"].shape == (f.n_heads, T, f.head_dim)
    assert acts["blocks.0.attn.hook_k"].shape == (f.n_kv_heads, T, f.head_dim)
    assert acts["blocks.*.attn.hook_z|last"].shape == (f.n_layers, f.n_heads * f.head_dim)
    assert np.allclose(acts["blocks.0.hook_resid_pre"], acts["hook_embed"])
    assert np.array_equal(acts["blocks.3.hook_resid_post"], acts["blocks.4.hook_resid_pre"])  # one tensor, two names
    assert np.allclose(acts["blocks.3.attn.hook_pattern|last"], pattern[3][:, -1, :].astype(np.float32), atol=1e-3)  # float16 vs float32
    # the next token against a plain transformers forward of the same ids (no hooks)
    with torch.inference_mode():
        plain = lm.model(input_ids=torch.tensor([[t.id for t in tr.tokens]], device=lm.device)).logits[0, -1].float().cpu().numpy()
    assert int(tr.next_logits.argmax()) == int(plain.argmax()) and np.allclose(tr.next_logits, plain, atol=1e-3 * float(np.abs(plain).max()))
    if lm.key == pipeline.EMBEDDED:
        assert lm.tokenizer.decode([int(tr.next_logits.argmax())]) == " Paris"
    assert all(v >= 0 for v in tr.timings.values())


def test_smollm_paris_probability(smol):
    tr = pipeline.trace(smol, "The capital of France is")
    p = torch.softmax(torch.tensor(tr.next_logits), -1)
    assert smol.tokenizer.decode([int(p.argmax())]) == " Paris"
    assert 0.7 < float(p.max()) < 0.85  # ≈0.77 for the Q4_1 weights


def test_cross_checks_pass(lm):
    tr = pipeline.trace(lm, "Apple fell from the tree. 👋🏽", chat=True)
    for c in checks.all_checks(lm, tr, pipeline.Sampling(0.7, 40, 0.9, 0.02)):
        assert c.ok, c


def test_logit_lens_last_layer_equals_logits(lm):
    tr = pipeline.trace(lm, "Dog bites man.")
    ids, p = tr.lens_last_top[-1][0]
    ref = torch.softmax(torch.tensor(tr.next_logits), -1)
    assert ids == int(ref.argmax()) and abs(p - float(ref.max())) < 1e-4
    pos, gid, gp = lens_grid(lm, tr)
    assert pos[-1] == tr.T - 1 and gid.shape == (lm.facts.n_layers + 1, len(pos))
    assert int(gid[-1, -1]) == ids and abs(float(gp[-1, -1]) - p) < 1e-4


def test_long_prompt_is_pooled_and_keeps_full_layers(smol):
    prompt = "The quick brown fox jumps over the lazy dog. " * 60  # ~600 tokens
    tr = pipeline.trace(smol, prompt, attn_layers=[3])
    assert tr.T > 256 and tr.acts.attn_block > 1
    assert np.allclose(tr.acts["blocks.*.attn.hook_pattern|pooled"].astype(np.float32).sum(-1), 1, atol=2e-2)
    full = tr.attention(3)
    assert full.shape == (smol.facts.n_heads, tr.T, tr.T)
    assert np.allclose(full.astype(np.float32).sum(-1), 1, atol=2e-2)
    assert np.allclose(np.triu(full.astype(np.float32), 1), 0)  # causal
    assert tr.attention(5) is None
    assert np.allclose(tr.acts["blocks.3.attn.hook_pattern|last"], full[:, -1, :].astype(np.float32), atol=1e-3)
    assert "blocks.5.attn.hook_pattern" not in tr.acts and 3 in tr.acts.layers("blocks.*.attn.hook_pattern")


@pytest.mark.parametrize("bad", ["", "   ", "\n\t"])
def test_empty_prompts_are_refused(smol, bad):
    with pytest.raises(TraceError, match="empty"):
        pipeline.trace(smol, bad)


def test_over_context_and_over_limit(smol):
    with pytest.raises(TraceError, match="context window"):
        pipeline.trace(smol, "word " * 9000)
    with pytest.raises(TraceError, match="at most"):
        pipeline.trace(smol, "word " * 300, max_tokens=100)


def test_control_characters_and_special_text_trace(smol):
    tr = pipeline.trace(smol, "NUL\x00 bell\x07 <|im_end|>")
    assert np.isfinite(tr.next_logits).all()
    assert not any(t.special for t in tr.tokens)


def test_concurrent_traces_never_mix(smol):
    prompts = ["The capital of France is", "Why is the sky blue? Because", "Dog bites man. Man bites dog."] * 2
    ref = {p: pipeline.trace(smol, p) for p in set(prompts)}
    got, errors = {}, []

    def work(i, p):
        try:
            got[i] = pipeline.trace(smol, p)
        except Exception as e:  # pragma: no cover
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i, p)) for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, p in enumerate(prompts):
        a, b = got[i], ref[p]
        assert a.input_ids == b.input_ids
        assert np.array_equal(a.next_logits, b.next_logits)
        for name in a.acts.names():
            assert np.array_equal(a.acts[name], b.acts[name]), name


def test_model_outside_a_trace_runs_sdpa_and_is_unchanged(smol):
    from pipeline.model.capture import NAME

    assert smol.model.config._attn_implementation == NAME
    ids = torch.tensor([smol.tokenizer("Hello there").input_ids])
    with torch.inference_mode():
        out = smol.model(ids, output_attentions=False)
    tr = pipeline.trace(smol, "Hello there")
    assert np.abs(out.logits[0, -1].numpy() - tr.next_logits).max() < 1e-3
