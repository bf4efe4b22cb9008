"""Page 16's experiments against independent references (transformers' generate, its tokenizer, plain math)."""

import pytest
import torch

from pipeline.lab import misconceptions as mc

pytestmark = pytest.mark.model


def test_forced_token_changes_the_rest_and_the_rest_is_greedy(smol):
    from transformers import GenerationConfig

    f = mc.force_token(smol, "The capital of France is", n=8, at=1)
    assert len(f.original) == 8 and f.forced != f.original[1] and len(f.after) == 8 - 2
    # the continuation after the forced token is what transformers' own greedy loop writes from there
    head = f.prompt_ids + f.original[:1] + [f.forced]
    gc = GenerationConfig(max_new_tokens=len(f.after), do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.inference_mode():
        ref = smol.model.generate(torch.tensor([head]), generation_config=gc)[0, len(head) :].tolist()
    assert ref == f.after
    assert f.checks[0].ok == (f.after != f.original[2:])
    assert f.checks[1].ok and len(f.step_ms) == 8


def test_word_pieces_are_the_tokenizers(smol):
    w = mc.word_pieces(smol.tokenizer)
    for r in w.rows:
        assert r["ids"] == smol.tokenizer(r["text"], add_special_tokens=False)["input_ids"]
    assert all(c.ok for c in w.checks), [c.detail for c in w.checks]


@pytest.mark.unit
def test_temperature_keeps_the_ranking():
    logits = torch.tensor([3.0, 1.0, 2.5, -1.0, 0.0])
    t = mc.temperature_sweep(logits, [0.5, 1.0, 2.0])
    assert [r.top_id for r in t.rows] == [0, 0, 0]
    assert t.rows[0].entropy_bits < t.rows[1].entropy_bits < t.rows[2].entropy_bits
    p = torch.softmax(logits / 2.0, -1)
    assert abs(t.rows[2].top_p - float(p.max())) < 1e-6
    assert all(c.ok for c in t.checks)


def test_context_cost_kv_follows_the_formula(smol):
    from pipeline.generation import kv_bytes_formula

    c = mc.context_cost(smol, [16, 64])
    assert [r["tokens"] for r in c.rows] == [16, 64]
    assert c.rows[1]["KV cache MiB"] == kv_bytes_formula(smol, 64) / 2**20 and c.checks[0].ok  # time: never asserted


def test_no_memory_between_requests(smol):
    m = mc.no_memory(smol, "Why is the sky blue?", "Dog bites man.")
    assert m.max_diff == 0.0 and m.checks[0].ok
