import pytest

from pipeline.forward.sampling import Sampling
from pipeline.generation import generate
from pipeline.generation.speculative import PromptLookup, expected_tokens_per_call, make_draft, speculative_generate

pytestmark = pytest.mark.model

COPY = "Rewrite this code with better names:\ndef f(a, b):\n    c = a + b\n    return c\n"


@pytest.mark.parametrize("draft", ["prompt_lookup", "early_exit:half"])
def test_greedy_speculative_equals_plain_greedy(lm, draft):
    """Speculative greedy output is plain greedy output: a draft that is often right (prompt lookup on a copy-style
    prompt) and one that is rarely right (half the target's layers: nearly every call rejects, 12 tokens show it)."""
    if draft == "early_exit:half":
        draft = f"early_exit:{lm.facts.n_layers // 2}"
    n, prompt = (24, COPY) if draft == "prompt_lookup" else (12, "The capital of France is")
    plain = [e.token_id for e in generate(lm, prompt, n)]
    res = speculative_generate(lm, prompt, draft, gamma=4, max_new_tokens=n)
    assert res.tokens == plain, (draft, prompt)
    assert res.target_calls == 1 + len(res.steps)
    assert all(s.accepted <= len(s.proposed) for s in res.steps)


def test_prompt_lookup_accepts_on_copy_prompts(smol):
    res = speculative_generate(smol, COPY, "prompt_lookup", gamma=4, max_new_tokens=30, chat=True)
    assert res.acceptance_rate > 0.3 and len(res.tokens) / res.target_calls > 1.2


def test_early_exit_draft_shares_weights_and_leaves_the_target_whole(smol):
    d = make_draft(smol, "early_exit:3")
    assert len(d.model.get_decoder().layers) == 3 and len(smol.model.get_decoder().layers) == 30
    assert d.model.get_decoder().layers[0] is smol.model.get_decoder().layers[0]
    assert d.model.lm_head is smol.model.lm_head
    with pytest.raises(ValueError):
        make_draft(smol, "early_exit:30")
    with pytest.raises(ValueError):
        make_draft(smol, "nonsense")


def test_sampling_is_seeded_and_well_formed(smol):
    a = speculative_generate(smol, COPY, "prompt_lookup", gamma=3, max_new_tokens=20, sampling=Sampling(temperature=0.8, seed=5))
    b = speculative_generate(smol, COPY, "prompt_lookup", gamma=3, max_new_tokens=20, sampling=Sampling(temperature=0.8, seed=5))
    assert a.tokens == b.tokens and 0 < len(a.tokens) <= 20


@pytest.mark.unit
def test_prompt_lookup_proposals_and_expected_length():
    pl = PromptLookup(max_ngram=2)
    assert pl.propose([1, 2, 3, 4, 9, 2, 3], 2)[0] == [4, 9]  # continues the earlier "2 3"
    assert pl.propose([1, 2, 3], 2)[0] == []
    assert expected_tokens_per_call(0.0, 4) == 1.0
    assert expected_tokens_per_call(1.0, 4) == 5.0
    assert expected_tokens_per_call(0.5, 1) == pytest.approx(1.5)


def test_attention_kernels_agree_and_eager_materialises_more(smol):
    from pipeline.lab.attention_kernels import available_kernels, kernel_sweep, score_matrix_mb

    ks = available_kernels(smol)
    assert "eager" in ks and "sdpa: math" in ks
    rows = kernel_sweep(smol, [64], ks)
    assert {r.kernel for r in rows} == set(ks)
    assert all(r.max_diff_vs_eager < 1e-3 for r in rows)
    assert score_matrix_mb(smol, 1024) == 9 * 1024 * 1024 * 4 / 2**20
    assert smol.model.config._attn_implementation == "explorer"  # restored after the sweep
