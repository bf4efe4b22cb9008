import numpy as np
import pytest
import torch

import pipeline
from pipeline.forward import analysis

pytestmark = pytest.mark.model


def test_rotate_matches_transformers_rope(lm):
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    inv = analysis.rope_inv_freq(lm, 0)
    D = lm.facts.head_dim
    x = np.random.default_rng(0).standard_normal((5, D))
    pos = np.arange(5)
    ang = np.outer(pos, inv)
    emb = np.concatenate([ang, ang], -1)
    cos, sin = torch.tensor(np.cos(emb))[None], torch.tensor(np.sin(emb))[None]
    xt = torch.tensor(x)[None, None]
    ref, _ = apply_rotary_pos_emb(xt, xt, cos, sin)
    mine = np.stack([analysis.rotate(x[i], i, inv) for i in range(5)])
    assert np.allclose(ref[0, 0].numpy(), mine, atol=1e-10)


def test_captured_query_key_undo_and_redo_rope(lm):
    tr = pipeline.trace(lm, "Dog bites man. Man bites dog.")
    inv = analysis.rope_inv_freq(lm, 2)
    q, k = tr.acts["blocks.2.attn.hook_q"][0].astype(np.float64), tr.acts["blocks.2.attn.hook_k"][0].astype(np.float64)
    m, n = tr.T - 1, 1
    q_raw, k_raw = analysis.rotate(q[m], -m, inv), analysis.rotate(k[n], -n, inv)
    assert np.isclose(analysis.rotate(q_raw, m, inv) @ analysis.rotate(k_raw, n, inv), q[m] @ k[n], rtol=1e-5)
    s0 = analysis.relative_scores(q_raw, k_raw, inv, 50, at=0)
    s1 = analysis.relative_scores(q_raw, k_raw, inv, 50, at=77)
    assert np.allclose(s0, s1, atol=1e-6 * np.abs(s0).max())
    assert np.isclose(s0[m - n], q[m] @ k[n], rtol=1e-5)


def test_apple_drift_starts_identical_and_diverges(smol):
    a = pipeline.trace(smol, "Apple released a new chip.")
    b = pipeline.trace(smol, "Apple fell from the tree.")
    ia, ib = analysis.find_token(a, "Apple"), analysis.find_token(b, "Apple")
    assert ia == ib == 0
    # position 0 sees only itself: identical at every layer (causal attention) -> use the later word instead
    cos = analysis.drift(a, ia, b, ib)
    assert np.allclose(cos, 1, atol=1e-5)
    a2 = pipeline.trace(smol, "I bought an Apple laptop.")
    b2 = pipeline.trace(smol, "I ate an Apple pie.")
    cos2 = analysis.drift(a2, analysis.find_token(a2, "Apple"), b2, analysis.find_token(b2, "Apple"))
    assert abs(cos2[0] - 1) < 1e-6 and cos2[-1] < 0.99


def test_embeddings_pca_and_neighbours(smol):
    tr = pipeline.trace(smol, "king queen man woman")
    assert np.allclose(analysis.embed_ids(smol, tr.input_ids), tr.acts["hook_embed"], atol=1e-6)
    coords, var = analysis.pca(tr.acts["hook_embed"], 3)
    assert coords.shape == (tr.T, 3) and 0 < var.sum() <= 1
    nn = analysis.nearest_tokens(smol, tr.input_ids[0], k=5)
    assert len(nn) == 5 and tr.input_ids[0] not in [i for i, _, _ in nn]
    assert all(-1 <= s <= 1 for _, _, s in nn)
    words = analysis.word_vectors(smol, ["Paris", " ", "France"])
    assert [w[0] for w in words] == ["Paris", "France"]
