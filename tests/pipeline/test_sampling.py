import itertools

import numpy as np
import pytest
import torch

from pipeline.forward import sampling
from pipeline.forward.sampling import Sampling
from pipeline.lab.checks import hf_processed_probs

pytestmark = pytest.mark.unit

COMBOS = list(itertools.product([0.0, 0.3, 0.7, 1.0, 1.6], [0, 1, 5, 50], [0.0, 0.5, 0.9, 1.0], [0.0, 0.1]))


@pytest.mark.parametrize("seed", range(4))
def test_filter_probs_equals_transformers_processors_on_random_logits(seed):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(1000, generator=g) * (1 + seed)
    if seed == 3:  # ties: many equal logits
        logits = torch.round(logits)
    for t, k, p, mp in COMBOS:
        mine = sampling.filter_probs(logits, Sampling(t, k, p, mp))
        ref = hf_processed_probs(logits, t, k, p, mp)
        assert torch.equal(mine > 0, ref > 0), (t, k, p, mp)
        assert torch.allclose(mine, ref, atol=1e-6), (t, k, p, mp)
        assert abs(float(mine.sum()) - 1) < 1e-5


@pytest.mark.model
def test_filter_probs_on_real_logits(smol):
    import pipeline

    tr = pipeline.trace(smol, "The capital of France is")
    for t, k, p, mp in [(0.7, 50, 0.9, 0.0), (1.0, 0, 0.95, 0.05), (1.3, 10, 1.0, 0.0)]:
        assert torch.allclose(sampling.filter_probs(tr.next_logits, Sampling(t, k, p, mp)), hf_processed_probs(tr.next_logits, t, k, p, mp), atol=1e-6)


def test_steps_are_consistent_with_the_final_distribution():
    logits = torch.randn(500, generator=torch.Generator().manual_seed(1)) * 3
    steps = sampling.filter_steps(logits, Sampling(0.8, 20, 0.8, 0.05))
    assert [s.name for s in steps] == ["softmax", "temperature", "top-k", "top-p", "min-p"]
    assert np.allclose(steps[-1].probs, sampling.filter_probs(logits, Sampling(0.8, 20, 0.8, 0.05)).numpy())
    kept = [s.kept for s in steps]
    assert kept == sorted(kept, reverse=True) and kept[2] == 20


def test_temperature_zero_is_greedy_and_sampling_is_seeded():
    logits = torch.tensor([1.0, 3.0, 2.0, 3.0])
    p = sampling.filter_probs(logits, Sampling(0.0))
    assert p.tolist() == [0, 1, 0, 0]  # first of the tied maxima, like argmax
    assert sampling.sample(logits, Sampling(0.0, seed=5)) == 1
    draws = [sampling.sample(torch.randn(100, generator=torch.Generator().manual_seed(0)), Sampling(1.0, seed=s)) for s in range(20)]
    again = [sampling.sample(torch.randn(100, generator=torch.Generator().manual_seed(0)), Sampling(1.0, seed=s)) for s in range(20)]
    assert draws == again and len(set(draws)) > 3


def test_top_p_edges():
    logits = torch.randn(300, generator=torch.Generator().manual_seed(2))
    assert int((sampling.filter_probs(logits, Sampling(1.0, 0, 0.0)) > 0).sum()) == 1
    assert torch.allclose(sampling.filter_probs(logits, Sampling(1.0, 0, 1.0)), torch.softmax(logits, -1))
    assert sampling.entropy_bits(torch.ones(8) / 8) == pytest.approx(3.0)
