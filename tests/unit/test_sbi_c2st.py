"""C2ST with the sbibm definition: its two ends of the scale, and whose statistics z-score."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trainforge.workloads.sbi.c2st import c2st, standardize


def test_same_distribution_scores_about_one_half() -> None:
    rng = np.random.default_rng(0)
    p = rng.normal(size=(1000, 2))
    q = rng.normal(size=(1000, 2))
    score = c2st(p, q)
    assert isinstance(score, float)
    assert 0.4 < score < 0.6


def test_separated_distributions_score_about_one() -> None:
    generator = torch.Generator().manual_seed(0)
    p = torch.randn(1000, 2, generator=generator)
    q = torch.randn(1000, 2, generator=generator) + torch.tensor([6.0, 0.0])
    assert c2st(p, q) > 0.95


def test_z_scoring_uses_the_reference_samples_statistics() -> None:
    rng = np.random.default_rng(1)
    reference = rng.normal(loc=[3.0, -1.0], scale=[2.0, 0.5], size=(500, 2))
    other = rng.normal(loc=[0.0, 0.0], scale=[10.0, 10.0], size=(300, 2))
    p, q = standardize(reference, other)
    np.testing.assert_allclose(p.mean(0), 0.0, atol=1e-12)
    np.testing.assert_allclose(p.std(0, ddof=1), 1.0)
    mean, std = reference.mean(0), reference.std(0, ddof=1)
    np.testing.assert_allclose(q, (other - mean) / std)
    # Swapping the arguments standardises with the other set's statistics instead.
    _, swapped = standardize(other, reference)
    np.testing.assert_allclose(swapped, (reference - other.mean(0)) / other.std(0, ddof=1))


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="dimensions differ"):
        c2st(np.zeros((10, 2)), np.zeros((10, 3)))
    with pytest.raises(ValueError, match=r"\[n, dim\]"):
        c2st(np.zeros(10), np.zeros(10))
    with pytest.raises(ValueError, match="1 NaN/inf"):
        c2st(np.array([[0.0], [np.nan]]), np.zeros((2, 1)))
