"""Long prompts at the forward's speed (SDPA in the trace, maps computed when read): on every family of families.py
(sliding windows and Gemma-3's local/global layers included) at 2,048 tokens, the trace's next-token logits equal a
plain transformers forward's and a layer's map read from it equals transformers' eager attention; the pooled overview
and the last rows are the eager maps' own; and a prompt of ~8,000 tokens is accepted on the embedded model."""

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from families import FAMILIES, family_folders  # noqa: E402

pytestmark = pytest.mark.model

T_LONG = 2048


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return family_folders(tmp_path_factory.mktemp("families_long"), long=T_LONG)


SENTENCE = "Rayleigh scattering sends the short blue wavelengths of sunlight across the sky in every direction, number {}. "


def _prompt(tok, n: int) -> str:
    """Plain prose of about n tokens (n to n + 30) for the tokenizer `tok`."""
    per = len(tok(SENTENCE.format(100))["input_ids"])
    k = n // per + 1
    while len(tok("".join(SENTENCE.format(100 + i) for i in range(k)))["input_ids"]) < n:
        k += 1
    return "".join(SENTENCE.format(100 + i) for i in range(k))


@pytest.mark.parametrize("family", FAMILIES)
def test_a_long_trace_equals_the_plain_forward_and_its_maps_eager_attention(folders, family):
    from transformers import AutoModelForCausalLM

    from pipeline import trace
    from pipeline.forward import display_maps
    from pipeline.model.capture import pool_attention
    from pipeline.model.loaded import load_model

    lm = load_model(str(folders[family]))
    tr = trace(lm, _prompt(lm.tokenizer, T_LONG))
    ids = list(tr.input_ids)
    assert T_LONG <= tr.T <= T_LONG + 40
    model = AutoModelForCausalLM.from_pretrained(folders[family], dtype=torch.float32).eval()
    with torch.no_grad():
        plain = model(torch.tensor([ids]), use_cache=False).logits[0, -1].numpy()
    assert np.abs(tr.next_logits - plain).max() <= 1e-3, family
    model.set_attn_implementation("eager")
    with torch.no_grad():
        eager = [a[0].numpy() for a in model(torch.tensor([ids]), output_attentions=True, use_cache=False).attentions]
    for layer in range(lm.facts.n_layers):
        mine = tr.attention(layer)
        assert mine is not None and np.abs(mine.astype(np.float32) - eager[layer]).max() <= 2e-3, (family, layer)
        last = tr.acts[f"blocks.{layer}.attn.hook_pattern|last"]
        assert np.abs(last - eager[layer][:, -1]).max() <= 2e-3, (family, layer)
        pooled = tr.acts[f"blocks.{layer}.attn.hook_pattern|pooled"].astype(np.float32)
        want = pool_attention(torch.from_numpy(eager[layer]), tr.acts.attn_block).numpy()
        assert np.abs(pooled - want).max() <= 2e-3, (family, layer)
    maps, block = display_maps(tr, 0)
    assert maps.shape[-1] <= 128 and block * maps.shape[-1] >= T_LONG
    assert np.allclose(maps.sum(-1), 1, atol=1e-2)


def test_a_trace_of_8000_tokens_is_accepted_and_equals_the_forward():
    from pipeline import trace
    from pipeline.model.loaded import load_model

    lm = load_model("smollm2-135m-instruct")
    tr = trace(lm, _prompt(lm.tokenizer, 8000))
    ids = list(tr.input_ids)
    assert 8000 <= tr.T <= lm.facts.max_positions
    with torch.inference_mode():
        plain = lm.model(input_ids=torch.tensor([ids]), logits_to_keep=1, use_cache=False).logits[0, -1].float().numpy()
    assert np.abs(tr.next_logits - plain).max() <= 1e-3
    row = tr.acts["blocks.29.attn.hook_pattern|last"]
    assert row.shape == (lm.facts.n_heads, tr.T) and np.allclose(row.sum(-1), 1, atol=1e-3)
