"""SBC and TARP through sbi's diagnostics on a real sbi posterior, KS summaries on posteriors whose
calibration is known, and the figures."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from matplotlib import image

from trainforge.workloads.sbi import calibration
from trainforge.workloads.sbi.calibration import pair_plot, plot_sbc
from trainforge.workloads.sbi.calibration import summary as sbc_summary

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MLFLOW_KEY = re.compile(r"^[A-Za-z0-9_\-./]+$")


def gaussian_sbc(
    seed: int, scale: float = 1.0, shift: float = 0.0, n_runs: int = 500, n_samples: int = 200
) -> tuple[torch.Tensor, int]:
    """Ranks for θ ~ N(0, 1), x = θ + N(0, 1) in d = 2, whose exact posterior is N(x/2, 1/2);
    ``scale`` shrinks or widens its std and ``shift`` moves its mean by that many stds."""
    generator = torch.Generator().manual_seed(seed)
    theta = torch.randn(n_runs, 2, generator=generator)
    x = theta + torch.randn(n_runs, 2, generator=generator)
    std = 0.5**0.5
    noise = torch.randn(n_runs, n_samples, 2, generator=generator)
    posterior = x.unsqueeze(1) / 2 + shift * std + scale * std * noise
    return (posterior < theta.unsqueeze(1)).sum(dim=1), n_samples


def png_shape(path: Path) -> tuple[int, int]:
    assert path.read_bytes()[:8] == PNG_MAGIC
    height, width = image.imread(path).shape[:2]
    return height, width


def _posterior(dim: int = 2) -> Any:
    """A real sbi DirectPosterior: an untrained MAF of sbi's builder over a Gaussian prior (no
    support to reject samples at), on the CPU."""
    from sbi.inference import DirectPosterior
    from sbi.neural_nets import posterior_nn

    torch.manual_seed(0)
    prior = torch.distributions.MultivariateNormal(torch.zeros(dim), torch.eye(dim))
    theta = prior.sample((200,))
    estimator = posterior_nn("maf", hidden_features=8, num_transforms=1)(theta, theta + 0.1)
    return DirectPosterior(estimator, prior), prior


def test_sbc_ranks_are_sbis_count_of_samples_below_the_truth_and_tarp_runs(
    tmp_path: Path,
) -> None:
    posterior, prior = _posterior()
    theta = prior.sample((30,))
    x = theta + 0.1 * torch.randn(30, 2)
    torch.manual_seed(5)
    ranks, summary = calibration.sbc(posterior, theta, x, n_samples=40)
    torch.manual_seed(5)  # the same draws, counted here
    drawn = posterior.sample_batched((40,), x=x, show_progress_bars=False)
    expected = (drawn.transpose(0, 1) < theta.unsqueeze(1)).sum(dim=1)
    assert ranks.shape == (30, 2) and torch.equal(ranks.long(), expected)
    assert summary == sbc_summary(ranks, 40)
    metrics = calibration.tarp(posterior, theta, x, tmp_path / "tarp.png", seed=0)
    assert set(metrics) == {"tarp/atc", "tarp/ks_pvalue"}
    assert all(isinstance(v, float) and np.isfinite(v) for v in metrics.values())
    assert -0.5 <= metrics["tarp/atc"] <= 0.5 and 0.0 <= metrics["tarp/ks_pvalue"] <= 1.0
    png_shape(tmp_path / "tarp.png")


def test_exactly_uniform_ranks_deviate_only_by_the_discretisation() -> None:
    n_samples = 49
    ranks = torch.arange(n_samples + 1).repeat(4).reshape(-1, 1).repeat(1, 3)
    summary = sbc_summary(ranks, n_samples)
    assert set(summary) == {
        "sbc/ks_pvalue_dim0",
        "sbc/ks_pvalue_dim1",
        "sbc/ks_pvalue_dim2",
        "sbc/ks_pvalue_min",
        "sbc/max_ecdf_deviation",
    }
    assert all(MLFLOW_KEY.match(key) for key in summary)
    assert all(isinstance(value, float) for value in summary.values())
    # Atoms k/49 each hold 1/50 of the mass: the sup deviation is 1/50, at u = 0.
    assert summary["sbc/max_ecdf_deviation"] == pytest.approx(1 / (n_samples + 1))
    assert summary["sbc/ks_pvalue_min"] > 0.99


def test_exact_posterior_is_calibrated() -> None:
    summary = sbc_summary(*gaussian_sbc(seed=0))
    assert summary["sbc/ks_pvalue_min"] > 1e-3
    assert summary["sbc/max_ecdf_deviation"] < 0.07
    assert summary["sbc/ks_pvalue_min"] == min(
        summary["sbc/ks_pvalue_dim0"], summary["sbc/ks_pvalue_dim1"]
    )


@pytest.mark.parametrize(
    ("scale", "shift"),
    [(0.3, 0.0), (1.0, 0.5)],
    ids=["over-confident", "biased"],
)
def test_miscalibrated_posteriors_are_rejected(scale: float, shift: float) -> None:
    summary = sbc_summary(*gaussian_sbc(seed=0, scale=scale, shift=shift))
    assert summary["sbc/ks_pvalue_min"] < 1e-6
    assert summary["sbc/max_ecdf_deviation"] > 0.15


def test_summary_numbers_pick_the_worst_dimension() -> None:
    calibrated, n_samples = gaussian_sbc(seed=2)
    overconfident, _ = gaussian_sbc(seed=3, scale=0.3)
    ranks = torch.cat((calibrated[:, :1], overconfident[:, 1:]), dim=1)
    summary = sbc_summary(ranks, n_samples)
    assert summary["sbc/ks_pvalue_dim0"] > 1e-3
    assert summary["sbc/ks_pvalue_dim1"] < 1e-6
    assert summary["sbc/ks_pvalue_min"] == summary["sbc/ks_pvalue_dim1"]
    assert summary["sbc/max_ecdf_deviation"] > 0.15


def test_summary_rejects_ranks_beyond_n_samples() -> None:
    with pytest.raises(ValueError, match="ranks must lie in"):
        sbc_summary(torch.tensor([[0], [11]]), n_samples=10)


def test_plot_sbc_writes_sbis_ecdf_and_rank_histograms(tmp_path: Path) -> None:
    ranks, n_samples = gaussian_sbc(seed=1, n_runs=200, n_samples=50)
    paths = plot_sbc(ranks, n_samples, tmp_path, labels=["a", "b"])
    assert paths == [tmp_path / "sbc.png", tmp_path / "sbc_ranks.png"]
    assert png_shape(paths[0]) == (4 * 90, 6 * 90)  # one panel, every dimension's ECDF
    height, width = png_shape(paths[1])  # a histogram per dimension, 2.6 x 2.2 in each
    assert abs(width - 2 * 2.6 * 90) <= 2 and abs(height - 2.2 * 90) <= 2


def test_plot_sbc_wraps_many_dimensions_into_rows(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    ranks = torch.randint(0, 101, (100, 7), generator=generator)
    _, histograms = plot_sbc(ranks, 100, tmp_path, labels=[f"t{i}" for i in range(7)])
    height, width = png_shape(histograms)
    assert abs(width - 5 * 2.6 * 90) <= 2
    assert abs(height - 2 * 2.2 * 90) <= 2


@pytest.mark.parametrize("dim", [1, 2, 10])
def test_pair_plot_writes_a_png_scaled_with_dimension(tmp_path: Path, dim: int) -> None:
    generator = torch.Generator().manual_seed(dim)
    npe = torch.randn(3000, dim, generator=generator)
    reference = 0.8 * torch.randn(1500, dim, generator=generator) + 0.2
    npe[0] = float("nan")  # a stray non-finite row must not break the figure
    truth = torch.full((dim,), 0.5)
    path = tmp_path / f"pairs{dim}.png"
    pair_plot({"NPE": npe, "reference": reference}, path, theta_true=truth)
    height, width = png_shape(path)
    side = max(1.6 * dim, 3.2) * 90
    assert abs(width - side) <= 2
    assert abs(height - side) <= 2


def test_pair_plot_draws_theta_true(tmp_path: Path) -> None:
    samples = {"NPE": torch.randn(400, 2, generator=torch.Generator().manual_seed(0))}
    plain, marked = tmp_path / "plain.png", tmp_path / "marked.png"
    pair_plot(samples, plain, labels=["mu", "sigma"])
    pair_plot(samples, marked, theta_true=torch.tensor([[0.3, -0.2]]), labels=["mu", "sigma"])
    difference = np.abs(image.imread(plain) - image.imread(marked)).sum()
    assert difference > 0


def test_pair_plot_rejects_inconsistent_inputs(tmp_path: Path) -> None:
    path = tmp_path / "bad.png"
    with pytest.raises(ValueError, match="expected 2"):
        pair_plot({"a": torch.zeros(5, 2), "b": torch.zeros(5, 3)}, path)
    with pytest.raises(ValueError, match="theta_true"):
        pair_plot({"a": torch.zeros(5, 2)}, path, theta_true=torch.zeros(3))
    with pytest.raises(ValueError, match="labels"):
        pair_plot({"a": torch.zeros(5, 2)}, path, labels=["x"])
    assert not path.exists()
