"""Calibration of amortised posteriors through sbi's own diagnostics, with two parts of our own:
sbi's ``check_sbc`` is left out for the KS test it wraps, as its C2STs took 15 s (d = 2) and
47 s (d = 10) of this project's CPU for 200 runs; and the pair plot's limits are central
quantiles, as sbi's min/max let one stray sample squash it.

Simulation-based calibration (SBC, Talts et al. 2018; ``sbi.diagnostics.run_sbc``) draws θ from
the prior, simulates x, samples the posterior given x and records the rank of the true θ among
the samples, per dimension. A posterior calibrated on average over the prior gives ranks uniform
on {0, …, n_samples}; an over-confident one piles them at both ends, an under-confident one in
the middle, a biased one on one side. Unlike C2ST this needs no reference posterior. TARP (Lemos
et al. 2023; ``run_tarp``) checks the joint coverage on the same pairs: its expected coverage
curve against the credibility level is the diagonal for a calibrated posterior; its area above
the diagonal past α = 0.5 (ATC) is positive for a too wide posterior, negative for a too narrow.

The ranks are discrete, so even a perfect posterior shows an ECDF deviation of up to about
``1 / n_samples``; keep ``n_samples`` well above ``sqrt(n_runs)`` for that to stay below the
sampling noise of the test.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
from scipy import stats

TARP_SAMPLES = 200
"""Posterior samples per run for TARP: a run's coverage is the fraction of samples nearer its
reference point than θ, so 200 resolve 0.005, finer than its bins (10 runs each), for a fifth of
the draws of SBC's default 1,000 (here SBC's sampling took 17.5 s, TARP's at 1,000 14.1 s)."""
MAX_SCATTER_POINTS = 2000
"""Rows per sample set in the pair plot (a seeded subsample), so a 10-d figure stays light."""


def sbc(
    posterior: Any, theta: torch.Tensor, x: torch.Tensor, n_samples: int
) -> tuple[torch.Tensor, dict[str, float]]:
    """sbi's ``run_sbc`` on (θ, x) pairs (on the posterior's device): the ranks [n_runs, d]
    and their KS summary (``summary``)."""
    from sbi.diagnostics import run_sbc

    with warnings.catch_warnings():  # fewer than 100 runs or samples; sbi's batch cap
        warnings.simplefilter("ignore", UserWarning)
        ranks, _ = run_sbc(theta, x, posterior, num_posterior_samples=n_samples,
                           show_progress_bar=False, use_batched_sampling=True)  # fmt: skip
    return ranks, summary(ranks, n_samples)


def summary(ranks: torch.Tensor, n_samples: int) -> dict[str, float]:
    """sbi's KS test of each dimension's ranks against the uniform, as MLflow-safe metrics.

    ``sbc/ks_pvalue_dim{i}`` per dimension, ``sbc/ks_pvalue_min`` over dimensions and
    ``sbc/max_ecdf_deviation``, the largest KS statistic (sup |ECDF − uniform CDF|) over
    dimensions. The minimum p-value is not corrected for testing d dimensions; compare it with
    ``alpha / d`` (Bonferroni) when deciding.
    """
    from sbi.diagnostics.sbc import check_uniformity_frequentist

    _check_ranks(ranks, n_samples)
    pvalues = [float(p) for p in check_uniformity_frequentist(ranks.cpu(), n_samples)]
    metrics = {f"sbc/ks_pvalue_dim{i}": p for i, p in enumerate(pvalues)}
    normalised = ranks.cpu().double().numpy() / n_samples
    deviations = [stats.kstest(column, "uniform").statistic for column in normalised.T]
    metrics["sbc/ks_pvalue_min"] = min(pvalues)
    metrics["sbc/max_ecdf_deviation"] = float(max(deviations))
    return metrics


def _check_ranks(ranks: torch.Tensor, n_samples: int) -> None:
    if ranks.ndim != 2 or ranks.shape[0] == 0:
        raise ValueError(f"ranks must be a non-empty [n_runs, d], got shape {tuple(ranks.shape)}")
    if n_samples < 1:
        raise ValueError(f"n_samples must be positive, got {n_samples}")
    if ranks.min() < 0 or ranks.max() > n_samples:
        # Usually a mismatch between the n_samples used for ranking and the one passed here.
        raise ValueError(f"ranks must lie in 0 … {n_samples}, got {ranks.min()} … {ranks.max()}")


def plot_sbc(ranks: torch.Tensor, n_samples: int, folder: Path, labels: list[str]) -> list[Path]:
    """sbi's rank plots: ``sbc.png``, every dimension's rank ECDF over the band a uniform keeps
    to 99% of the time, and ``sbc_ranks.png``, a rank histogram per dimension with its band."""
    from sbi.analysis import sbc_rank_plot

    n_runs, dim = ranks.shape
    bins = max(n_runs // 20, 2)  # Talts et al.'s 20 runs a bin
    cols = min(dim, 5)
    rows = -(-dim // cols)
    paths = [folder / "sbc.png", folder / "sbc_ranks.png"]
    sizes = {"cdf": (6.0, 4.0), "hist": (2.6 * cols, 2.2 * rows)}
    for path, kind in zip(paths, sizes, strict=True):
        fig, _ = sbc_rank_plot(ranks.cpu(), n_samples, num_bins=bins, plot_type=kind,
                               parameter_labels=labels, num_cols=cols,
                               figsize=sizes[kind])  # fmt: skip
        fig.suptitle(f"SBC: {n_runs} runs, {n_samples} posterior samples each", fontsize=10)
        fig.tight_layout()
        fig.savefig(path, dpi=90)
        plt.close(fig)
    return paths


def tarp(posterior: Any, theta: torch.Tensor, x: torch.Tensor, path: Path,
         seed: int) -> dict[str, float]:  # fmt: skip
    """sbi's ``run_tarp`` and ``check_tarp`` on (θ, x) pairs: ``tarp/atc`` and
    ``tarp/ks_pvalue``, and the coverage curve drawn by sbi's ``plot_tarp`` to ``path``."""
    from sbi.analysis import plot_tarp
    from sbi.diagnostics import check_tarp, run_tarp

    torch.manual_seed(seed)  # its reference points are drawn from the global generator
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        ecp, alpha = run_tarp(theta, x, posterior, num_posterior_samples=TARP_SAMPLES,
                              num_bins=max(len(theta) // 10, 2),  # sbi's 10 runs a bin
                              show_progress_bar=False, use_batched_sampling=True)  # fmt: skip
    atc, pvalue = check_tarp(ecp.cpu(), alpha.cpu())
    fig, _ = plot_tarp(ecp.cpu(), alpha.cpu(), title=f"TARP: {len(theta)} runs, ATC {atc:.3f}")
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return {"tarp/atc": float(atc), "tarp/ks_pvalue": float(pvalue)}


def pair_plot(
    samples: dict[str, torch.Tensor],
    path: Path,
    theta_true: torch.Tensor | None = None,
    labels: list[str] | None = None,
) -> None:
    """sbi's ``pairplot`` of one or more sample sets (e.g. "NPE" and "reference") over the same
    θ: histograms on the diagonal, a scatter of at most ``MAX_SCATTER_POINTS`` rows per set
    below it, ``theta_true`` ([d] or [1, d]) as a point; non-finite rows left out."""
    from sbi.analysis import pairplot

    if not samples:
        raise ValueError("pair_plot needs at least one sample set")
    sets, counts = _finite_sets(samples)
    dim = next(iter(sets.values())).shape[1]
    names = [f"θ{i}" for i in range(dim)] if labels is None else list(labels)
    if len(names) != dim:
        raise ValueError(f"{len(names)} labels for {dim} dimensions")
    points = []
    if theta_true is not None:
        truth = theta_true.detach().cpu().double().numpy().reshape(1, -1)
        if truth.shape[1] != dim:
            raise ValueError(f"theta_true has {truth.shape[1]} values, samples have d = {dim}")
        points = [truth]
    size = max(1.6 * dim, 3.2)
    fig, _ = pairplot(
        list(sets.values()), points=points or None, limits=_limits(sets, points), labels=names,
        upper=None, lower="scatter", diag="hist", figsize=(size, size),
        lower_kwargs={"mpl_kwargs": {"s": 4, "alpha": 0.4, "linewidths": 0, "rasterized": True}},
        fig_kwargs={"legend": True,
                    "samples_labels": [f"{name} (n={counts[name]})" for name in sets],
                    "points_labels": ["θ true"], "points_colors": ["black"],
                    "fig_subplots_adjust": {"top": 0.97, "bottom": 0.14, "left": 0.06}},
    )  # fmt: skip
    fig.savefig(path, dpi=90)
    plt.close(fig)


def _finite_sets(
    samples: dict[str, torch.Tensor],
) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """Each set's finite rows, at most ``MAX_SCATTER_POINTS`` of them (seeded), and how many
    finite rows it has: a diagnostic figure still renders when a flow emits a few inf/NaN rows;
    C2ST rejects those loudly."""
    sets: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    rng = np.random.default_rng(0)
    for name, given in samples.items():
        if given.ndim != 2:
            raise ValueError(f"samples {name!r} must be [n, d], got shape {tuple(given.shape)}")
        dim = next(iter(sets.values())).shape[1] if sets else given.shape[1]
        if given.shape[1] != dim:
            raise ValueError(f"samples {name!r} have d = {given.shape[1]}, expected {dim}")
        values = given.detach().cpu().double().numpy()
        values = values[np.isfinite(values).all(axis=1)]
        counts[name] = len(values)
        if len(values) > MAX_SCATTER_POINTS:
            values = values[rng.choice(len(values), MAX_SCATTER_POINTS, replace=False)]
        sets[name] = values
    return sets, counts


def _limits(sets: dict[str, np.ndarray], points: list[np.ndarray]) -> list[list[float]]:
    """Per dimension, the central 99% of all sets (and the true θ), padded by 5%."""
    pooled = np.concatenate([values for values in sets.values() if len(values)] + points)
    lo, hi = np.quantile(pooled, [0.005, 0.995], axis=0)
    if points:
        lo, hi = np.minimum(lo, points[0][0]), np.maximum(hi, points[0][0])
    pad = np.where(hi > lo, 0.05 * (hi - lo), 0.5)
    return np.stack([lo - pad, hi + pad], axis=1).tolist()
