"""Calibration diagnostics for amortised posteriors: simulation-based calibration (SBC) and
corner plots.

SBC (Talts et al. 2018) draws θ from the prior, simulates x, samples the approximate posterior
given x, and records the rank of the true θ among those samples. A posterior that is calibrated
on average over the prior gives ranks uniform on {0, …, n_samples}; an over-confident one piles
ranks at both ends (∪ shape), an under-confident one in the middle (∩), a biased one on one side.
Unlike C2ST this needs no reference posterior, so it works for every task.

Ranks are normalised as ``rank / n_samples`` and compared with the continuous Uniform(0, 1), as
sbi does. The ranks are discrete, so even a perfect posterior shows an ECDF deviation of up to
about ``1 / n_samples``; keep ``n_samples`` well above ``sqrt(n_runs)`` for that to stay below
the sampling noise of the test.
"""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from scipy import stats

_SBC_COLUMNS = 5  # dimensions per row of the SBC figure, so d = 10 stays readable


def sbc_ranks(prior_theta: torch.Tensor, posterior_samples: torch.Tensor) -> torch.Tensor:
    """Per run and dimension, the number of posterior samples strictly below the true θ.

    ``prior_theta`` is [n_runs, d], ``posterior_samples`` [n_runs, n_samples, d]; returns an
    int64 tensor [n_runs, d] with values in 0 … n_samples.
    """
    if prior_theta.ndim != 2:
        raise ValueError(f"prior_theta must be [n_runs, d], got shape {tuple(prior_theta.shape)}")
    if posterior_samples.ndim != 3:
        raise ValueError(
            "posterior_samples must be [n_runs, n_samples, d], "
            f"got shape {tuple(posterior_samples.shape)}"
        )
    n_runs, dim = prior_theta.shape
    if posterior_samples.shape[0] != n_runs or posterior_samples.shape[2] != dim:
        raise ValueError(
            f"posterior_samples {tuple(posterior_samples.shape)} do not match "
            f"prior_theta {tuple(prior_theta.shape)}"
        )
    below = posterior_samples < prior_theta.to(posterior_samples.dtype).unsqueeze(1)
    return below.sum(dim=1, dtype=torch.int64)


def _normalised_ranks(ranks: torch.Tensor, n_samples: int) -> np.ndarray:
    if ranks.ndim != 2 or ranks.shape[0] == 0:
        raise ValueError(f"ranks must be a non-empty [n_runs, d], got shape {tuple(ranks.shape)}")
    if n_samples < 1:
        raise ValueError(f"n_samples must be positive, got {n_samples}")
    values = ranks.detach().cpu().numpy().astype(np.float64)
    if values.min() < 0 or values.max() > n_samples:
        # Usually a mismatch between the n_samples used for ranking and the one passed here.
        raise ValueError(f"ranks must lie in 0 … {n_samples}, got {values.min()} … {values.max()}")
    return values / n_samples


def sbc_summary(ranks: torch.Tensor, n_samples: int) -> dict[str, float]:
    """KS tests of the normalised ranks against Uniform(0, 1), as MLflow-safe metrics.

    ``sbc/ks_pvalue_dim{i}`` per dimension, ``sbc/ks_pvalue_min`` over dimensions and
    ``sbc/max_ecdf_deviation``, the largest sup |ECDF − uniform CDF| (the KS statistic) over
    dimensions. The minimum p-value is not corrected for testing d dimensions; compare it with
    ``alpha / d`` (Bonferroni) when deciding.
    """
    normalised = _normalised_ranks(ranks, n_samples)
    metrics: dict[str, float] = {}
    pvalues, deviations = [], []
    for i in range(normalised.shape[1]):
        result = stats.kstest(normalised[:, i], "uniform")
        metrics[f"sbc/ks_pvalue_dim{i}"] = float(result.pvalue)
        pvalues.append(float(result.pvalue))
        deviations.append(float(result.statistic))
    metrics["sbc/ks_pvalue_min"] = min(pvalues)
    metrics["sbc/max_ecdf_deviation"] = max(deviations)
    return metrics


def _dkw_halfwidth(n_runs: int, alpha: float = 0.05) -> float:
    # Dvoretzky–Kiefer–Wolfowitz (Massart's constant): P(sup |ECDF − F| > ε) ≤ 2 exp(−2 n ε²).
    return math.sqrt(math.log(2.0 / alpha) / (2.0 * n_runs))


def _dim_labels(labels: list[str] | None, dim: int) -> list[str]:
    if labels is None:
        return [f"θ{i}" for i in range(dim)]
    if len(labels) != dim:
        raise ValueError(f"{len(labels)} labels for {dim} dimensions")
    return list(labels)


def plot_sbc(
    ranks: torch.Tensor,
    n_samples: int,
    path: Path,
    labels: list[str] | None = None,
    histogram: bool = True,
) -> None:
    """ECDF-difference plot of the normalised ranks per dimension, optionally over a rank histogram.

    The grey band is the Dvoretzky–Kiefer–Wolfowitz 95% band, ±sqrt(ln(2/0.05) / (2 n_runs)):
    simultaneous over the whole ECDF of one dimension (not over all dimensions at once), and a
    little conservative. The histogram's band is the pointwise binomial 95% interval per bin,
    so about one bin in twenty leaves it even for a calibrated posterior.
    """
    normalised = _normalised_ranks(ranks, n_samples)
    n_runs, dim = normalised.shape
    names = _dim_labels(labels, dim)
    # Evaluate on the rank atoms as well as a fine grid so the ECDF's jumps are drawn exactly;
    # both are k / n_samples-style float divisions, so the atoms compare equal to the data.
    atoms = np.arange(n_samples + 1) / n_samples
    grid = np.unique(np.concatenate((atoms, np.linspace(0.0, 1.0, 401))))
    halfwidth = _dkw_halfwidth(n_runs)
    bins = min(n_samples + 1, 20)
    edges = np.linspace(0.0, 1.0, bins + 1)
    # Bins hold unequal numbers of atoms when bins does not divide n_samples + 1; the expected
    # count per bin follows the atoms, not the bin width.
    expected_p = np.histogram(atoms, bins=edges)[0] / (n_samples + 1)
    low = stats.binom.ppf(0.025, n_runs, expected_p)
    high = stats.binom.ppf(0.975, n_runs, expected_p)

    cols = min(dim, _SBC_COLUMNS)
    blocks = math.ceil(dim / cols)
    per_dim = 2 if histogram else 1
    fig, axes = plt.subplots(
        blocks * per_dim, cols, figsize=(2.6 * cols, 2.2 * blocks * per_dim), dpi=90, squeeze=False
    )
    for ax in axes.flat:
        ax.set_visible(False)
    for i in range(dim):
        row, col = (i // cols) * per_dim, i % cols
        values = np.sort(normalised[:, i])
        ecdf = np.searchsorted(values, grid, side="right") / n_runs
        ax = axes[row, col]
        ax.set_visible(True)
        ax.fill_between(grid, -halfwidth, halfwidth, color="0.85")
        ax.plot(grid, ecdf - grid, color="tab:blue", lw=1.0)
        ax.axhline(0.0, color="0.4", lw=0.6)
        ax.set_xlim(0.0, 1.0)
        ax.set_title(names[i], fontsize=9)
        ax.set_xlabel("normalised rank", fontsize=8)
        if col == 0:
            ax.set_ylabel("ECDF − uniform", fontsize=8)
        ax.tick_params(labelsize=7)
        if histogram:
            hist_ax = axes[row + 1, col]
            hist_ax.set_visible(True)
            hist_ax.stairs(high, edges, baseline=low, fill=True, color="0.85")
            hist_ax.stairs(np.histogram(values, bins=edges)[0], edges, color="tab:blue")
            hist_ax.set_xlim(0.0, 1.0)
            hist_ax.set_xlabel("normalised rank", fontsize=8)
            if col == 0:
                hist_ax.set_ylabel("count", fontsize=8)
            hist_ax.tick_params(labelsize=7)
    fig.suptitle(f"SBC: {n_runs} runs, {n_samples} posterior samples each", fontsize=10)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _finite_rows(samples: torch.Tensor, name: str, dim: int | None) -> np.ndarray:
    if samples.ndim != 2:
        raise ValueError(f"samples {name!r} must be [n, d], got shape {tuple(samples.shape)}")
    if dim is not None and samples.shape[1] != dim:
        raise ValueError(f"samples {name!r} have d = {samples.shape[1]}, expected {dim}")
    array = samples.detach().cpu().numpy().astype(np.float64)
    # A diagnostic figure should still render when a flow emits a few inf/NaN rows; C2ST is
    # where such rows are rejected loudly.
    return array[np.isfinite(array).all(axis=1)]


def pair_plot(
    samples: dict[str, torch.Tensor],
    path: Path,
    theta_true: torch.Tensor | None = None,
    labels: list[str] | None = None,
    max_points: int = 2000,
) -> None:
    """Corner plot of one or more sample sets (e.g. "NPE" and "reference") over the same θ.

    Diagonal: 1-D histograms on shared bins, one colour per set. Lower triangle: scatter of at
    most ``max_points`` rows per set (a seeded subsample, so the figure is reproducible).
    ``theta_true`` ([d] or [1, d]) is drawn as black lines and points.
    """
    if not samples:
        raise ValueError("pair_plot needs at least one sample set")
    sets: dict[str, np.ndarray] = {}
    dim: int | None = None
    for name, given in samples.items():
        sets[name] = _finite_rows(given, name, dim)
        dim = sets[name].shape[1]
    assert dim is not None
    names = _dim_labels(labels, dim)
    truth = None
    if theta_true is not None:
        truth = theta_true.detach().cpu().numpy().astype(np.float64).reshape(-1)
        if truth.shape[0] != dim:
            raise ValueError(f"theta_true has {truth.shape[0]} values, samples have d = {dim}")

    # Shared limits from central quantiles of all sets, so one far outlier does not squash the
    # plot and both sets are compared on identical bins.
    pooled = np.concatenate(
        [values for values in sets.values() if len(values)] or [np.zeros((1, dim))]
    )
    lo, hi = np.quantile(pooled, [0.005, 0.995], axis=0)
    if truth is not None:
        lo, hi = np.minimum(lo, truth), np.maximum(hi, truth)
    pad = np.where(hi > lo, 0.05 * (hi - lo), 0.5)
    lo, hi = lo - pad, hi + pad

    rng = np.random.default_rng(0)
    shown = {
        name: values[rng.choice(len(values), max_points, replace=False)]
        if len(values) > max_points
        else values
        for name, values in sets.items()
    }
    colours = {name: f"C{k}" for k, name in enumerate(sets)}
    hist_style = {"density": True, "histtype": "step"}
    # Rasterised dots keep a 10-d figure with 45 scatter panels a reasonable file size.
    dot_style = {"s": 2, "alpha": 0.2, "linewidths": 0, "rasterized": True}
    size = max(1.6 * dim, 3.2)
    fig, axes = plt.subplots(dim, dim, figsize=(size, size), dpi=90, squeeze=False)
    for row in range(dim):
        for col in range(dim):
            ax = axes[row, col]
            if col > row:
                ax.set_visible(False)
                continue
            if row == col:
                edges = np.linspace(lo[col], hi[col], 41)
                for name, values in sets.items():
                    label = f"{name} (n={len(values)})"
                    ax.hist(values[:, col], edges, color=colours[name], label=label, **hist_style)
                ax.set_yticks([])
                if truth is not None:
                    ax.axvline(truth[col], color="black", lw=1.0)
            else:
                for name, values in shown.items():
                    ax.scatter(values[:, col], values[:, row], color=colours[name], **dot_style)
                if truth is not None:
                    ax.axvline(truth[col], color="black", lw=0.6)
                    ax.axhline(truth[row], color="black", lw=0.6)
                    ax.plot(truth[col], truth[row], "o", color="black", ms=3)
                ax.set_ylim(lo[row], hi[row])
                if col == 0:
                    ax.set_ylabel(names[row], fontsize=8)
                else:
                    ax.set_yticklabels([])
            ax.set_xlim(lo[col], hi[col])
            if row == dim - 1:
                ax.set_xlabel(names[col], fontsize=8)
            else:
                ax.set_xticklabels([])
            ax.tick_params(labelsize=6)
    if dim == 1:
        axes[0, 0].legend(fontsize=7, frameon=False)
    else:
        # The empty upper triangle is free space for the legend.
        handles, legend_labels = axes[0, 0].get_legend_handles_labels()
        fig.legend(handles, legend_labels, loc="upper right", fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
