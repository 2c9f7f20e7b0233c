"""SBC ranks and KS summaries on posteriors whose calibration is known, and the two figures."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib import image

from trainforge.workloads.sbi.calibration import pair_plot, plot_sbc, sbc_ranks, sbc_summary

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
    return sbc_ranks(theta, posterior), n_samples


def png_shape(path: Path) -> tuple[int, int]:
    assert path.read_bytes()[:8] == PNG_MAGIC
    height, width = image.imread(path).shape[:2]
    return height, width


def test_ranks_count_samples_strictly_below_the_truth() -> None:
    theta = torch.tensor([[0.0, 1.0], [2.0, -1.0]])
    samples = torch.tensor(
        [
            [[-1.0, 5.0], [0.0, 0.0], [0.5, 2.0], [-0.1, 3.0]],
            [[3.0, -2.0], [1.0, -3.0], [2.5, -1.0], [1.9, -1.5]],
        ]
    )
    ranks = sbc_ranks(theta, samples)
    # Samples equal to θ (0.0 in run 0, -1.0 in run 1) do not count as below it.
    assert ranks.tolist() == [[2, 1], [2, 3]]
    assert ranks.dtype == torch.int64
    assert sbc_ranks(theta, samples + 10.0).tolist() == [[0, 0], [0, 0]]
    assert sbc_ranks(theta, samples - 10.0).tolist() == [[4, 4], [4, 4]]


def test_ranks_reject_mismatched_shapes() -> None:
    with pytest.raises(ValueError, match="do not match"):
        sbc_ranks(torch.zeros(3, 2), torch.zeros(3, 10, 4))
    with pytest.raises(ValueError, match="n_runs, n_samples, d"):
        sbc_ranks(torch.zeros(3, 2), torch.zeros(3, 2))


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


@pytest.mark.parametrize("histogram", [True, False])
def test_plot_sbc_writes_a_png_with_one_panel_per_dimension(
    tmp_path: Path, histogram: bool
) -> None:
    ranks, n_samples = gaussian_sbc(seed=1, n_runs=200, n_samples=50)
    path = tmp_path / "sbc.png"
    plot_sbc(ranks, n_samples, path, labels=["a", "b"], histogram=histogram)
    height, width = png_shape(path)
    # 2.6 x 2.2 inches per panel at 90 dpi; the histogram adds a second row.
    assert abs(width - 2 * 2.6 * 90) <= 2
    assert abs(height - (2 if histogram else 1) * 2.2 * 90) <= 2


def test_plot_sbc_wraps_many_dimensions_into_rows(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    ranks = torch.randint(0, 101, (100, 7), generator=generator)
    path = tmp_path / "sbc7.png"
    plot_sbc(ranks, 100, path)
    height, width = png_shape(path)
    assert abs(width - 5 * 2.6 * 90) <= 2
    assert abs(height - 4 * 2.2 * 90) <= 2


@pytest.mark.parametrize("dim", [1, 2, 10])
def test_pair_plot_writes_a_png_scaled_with_dimension(tmp_path: Path, dim: int) -> None:
    generator = torch.Generator().manual_seed(dim)
    npe = torch.randn(3000, dim, generator=generator)
    reference = 0.8 * torch.randn(1500, dim, generator=generator) + 0.2
    npe[0] = float("nan")  # a stray non-finite row must not break the figure
    truth = torch.full((dim,), 0.5)
    path = tmp_path / f"pairs{dim}.png"
    pair_plot({"NPE": npe, "reference": reference}, path, theta_true=truth, max_points=500)
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
