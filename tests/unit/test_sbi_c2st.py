"""C2ST through sbi with sbibm's settings: the same value as sbibm's definition written out
(z-scored by the reference, MLP 10·dim × 2, 5-fold KFold) on fixed samples and seed — in
float32, as sbibm computed, and, given float64 samples, the value of this project's former own
copy, which computed in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sbi.utils.metrics import c2st as sbi_c2st
from sklearn.model_selection import KFold, cross_val_score
from sklearn.neural_network import MLPClassifier

from trainforge.workloads.sbi.c2st import c2st, sbibm_classifier


def sbibm_definition(p: torch.Tensor, q: torch.Tensor, seed: int, dtype: torch.dtype) -> float:
    """sbibm.metrics.c2st (sbibm 1.1.0), step by step, in ``dtype``."""
    p, q = p.to(dtype), q.to(dtype)
    mean, std = p.mean(0), p.std(0)  # the reference's statistics, n - 1 denominator
    p, q = (p - mean) / std, (q - mean) / std
    dim = p.shape[1]
    classifier = MLPClassifier(
        activation="relu", hidden_layer_sizes=(10 * dim, 10 * dim), max_iter=10_000,
        solver="adam", random_state=seed,
    )  # fmt: skip
    data = np.concatenate((p.numpy(), q.numpy()))
    target = np.concatenate((np.zeros(len(p)), np.ones(len(q))))
    folds = KFold(n_splits=5, shuffle=True, random_state=seed)
    return float(np.mean(cross_val_score(classifier, data, target, cv=folds, scoring="accuracy")))


def same(score: float, expected: float) -> bool:
    """Equal up to the order of summing the five fold accuracies (sbi averages them in torch,
    sbibm in numpy): distinct scores of 500 samples in 5 folds differ by at least 1/500."""
    return score == pytest.approx(expected, abs=1e-12)


@pytest.fixture
def samples() -> tuple[torch.Tensor, torch.Tensor]:
    """A reference and a slightly wider, shifted approximation, 250 each, 2-d."""
    generator = torch.Generator().manual_seed(0)
    reference = torch.randn(250, 2, generator=generator) * torch.tensor([2.0, 0.5]) + 3.0
    other = 1.3 * torch.randn(250, 2, generator=generator) * torch.tensor([2.0, 0.5]) + 3.2
    return reference, other


def test_c2st_is_sbibms_definition_in_float32(samples: tuple[torch.Tensor, torch.Tensor]) -> None:
    reference, other = samples
    score = c2st(reference, other, seed=7)
    assert isinstance(score, float)
    assert same(score, sbibm_definition(reference, other, seed=7, dtype=torch.float32))
    # float64 or numpy input is cast to float32 first: the same number
    assert c2st(reference.double().numpy(), other.double(), seed=7) == score
    # the reference is the first argument: its statistics z-score both sets
    swapped = c2st(other, reference, seed=7)
    assert same(swapped, sbibm_definition(other, reference, seed=7, dtype=torch.float32))


def test_folds_trained_in_several_processes_give_the_same_score(
    samples: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """Each fold's classifier is seeded alike wherever it trains: two processes, one score."""
    reference, other = samples
    assert c2st(reference, other, seed=7, processes=2) == c2st(reference, other, seed=7)


def test_small_c2sts_on_few_cores_keep_their_folds_in_one_process() -> None:
    from trainforge.workloads.sbi.c2st import fold_processes

    assert fold_processes(1_000, 2, usable=2) == 1  # the pool's start would cost more
    assert fold_processes(10_000, 2, usable=2) == 2
    assert fold_processes(1_000, 2, usable=16) == 16  # c2st uses at most one per fold


def test_sbi_with_sbibms_settings_equals_the_former_float64_copy(
    samples: tuple[torch.Tensor, torch.Tensor],
) -> None:
    reference, other = (s.double() for s in samples)
    settings = sbibm_classifier(2)
    via_sbi = sbi_c2st(
        reference, other, seed=7, n_folds=5, classifier="mlp", classifier_kwargs=settings
    )
    assert same(float(via_sbi), sbibm_definition(reference, other, seed=7, dtype=torch.float64))


def test_separated_distributions_score_about_one() -> None:
    generator = torch.Generator().manual_seed(0)
    p = torch.randn(500, 2, generator=generator)
    q = torch.randn(500, 2, generator=generator) + torch.tensor([6.0, 0.0])
    assert c2st(p, q) > 0.95


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="dimensions differ"):
        c2st(np.zeros((10, 2)), np.zeros((10, 3)))
    with pytest.raises(ValueError, match=r"\[n, dim\]"):
        c2st(np.zeros(10), np.zeros(10))
    with pytest.raises(ValueError, match="1 NaN/inf"):
        c2st(np.array([[0.0], [np.nan]]), np.zeros((2, 1)))
