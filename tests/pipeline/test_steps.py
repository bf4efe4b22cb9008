"""The decode loop seen from the cache (pipeline.generation.steps, `python -m pipeline steps`): on the embedded model
and every family of families.py, the tokens equal transformers' greedy `generate`, every step's rows equal the last
row of transformers' eager attention over the same ids at every layer, and the cache's bytes equal K and V's size."""

import io
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent))
from families import FAMILIES, family_folders  # noqa: E402

pytestmark = pytest.mark.model

PROMPT = "The capital of France is"
NEW = 5


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    return family_folders(tmp_path_factory.mktemp("families_steps"))


def _cache_bytes(model, ids) -> int:
    """The bytes of K and V in transformers' own DynamicCache after a forward over `ids` (every layer)."""
    from transformers import DynamicCache

    cache = DynamicCache(config=model.config)
    model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))


def _check(lm, folder=None):
    from transformers import AutoModelForCausalLM

    from pipeline.generation.steps import steps

    got = steps(lm, PROMPT, new=NEW)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval() if folder else lm.model
    ids = torch.tensor([got.prompt_ids])
    with torch.no_grad():
        want = model.generate(ids, max_new_tokens=NEW, do_sample=False, min_new_tokens=NEW)[0, ids.shape[1] :].tolist()
    assert [s.token_id for s in got.steps] == want
    f, P = lm.facts, len(got.prompt_ids)
    from contextlib import nullcontext

    if folder:
        model.set_attn_implementation("eager")  # a model of this test's own
    with nullcontext() if folder else lm.arch.attention_as("eager"):  # the shared one: for this block only
        for s, step in enumerate(got.steps):
            assert step.cache_len == P + s
            with torch.no_grad():
                att = model(torch.tensor([got.ids[: P + s]]), output_attentions=True, use_cache=False).attentions
                real = _cache_bytes(model, got.ids[: P + s])
            # what the model's own cache holds after this step (a sliding layer keeps only its window less one)
            assert step.kv_bytes == real, (s, step.kv_bytes, real)
            for layer in range(f.n_layers):
                mine = step.attention[layer]
                assert mine.shape == (f.n_heads, P + s)
                assert np.abs(mine - att[layer][0, :, -1].numpy()).max() <= 2e-3, (s, layer)
    return got


def test_steps_on_the_embedded_model_and_its_command_line():
    from pipeline.__main__ import main
    from pipeline.model.loaded import load_model

    lm = load_model("smollm2-135m-instruct")
    got = _check(lm)
    f = lm.facts
    for step in got.steps:  # no sliding layers: 2 (K and V) x KV heads x head dim x 4 bytes x layers x tokens
        assert step.kv_bytes == 2 * f.n_kv_heads * f.head_dim * 4 * f.n_layers * step.cache_len
    buf = io.StringIO()
    assert main(["steps", PROMPT, "--new", "3", "--layer", "2", "--json"], out=buf) == 0
    doc = json.loads(buf.getvalue())
    assert [s["token_id"] for s in doc["steps"]] == [s.token_id for s in got.steps[:3]]
    first = doc["steps"][0]
    assert first["cache_len"] == len(got.prompt_ids) and len(first["attention"]) == f.n_heads
    assert np.allclose(first["attention"], got.steps[0].attention[2], atol=1e-5)
    assert {"token_id", "token", "cache_len", "kv_bytes", "attention"} <= set(first)


@pytest.mark.parametrize("family", FAMILIES)
def test_steps_on_every_family(folders, family):
    from pipeline.model.loaded import load_model

    _check(load_model(str(folders[family])), folders[family])
