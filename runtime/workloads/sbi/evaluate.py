"""After training: the posterior at the task's observations, scored against reference samples
(C2ST, sbibm's definition), simulation-based calibration, and a pair plot.

The observations and reference samples are sbibm's stored ones or this project's own
(``workload.evaluation.observations_from``, see ``observations``); which ones is said on every
evaluation line and recorded in ``observations.json``.

Runs on rank 0, through sbi's posterior object of the method — the one users get:
``DirectPosterior`` for NPE, so what is scored includes its rejection of samples outside the
prior's support; ``MCMCPosterior`` for NLE and NRE, so their MCMC is scored with the estimator;
``VectorFieldPosterior`` for FMPE and NPSE, their ODE or SDE solve. SBC and TARP need the
posterior at each of ``sbc_runs`` simulated observations: a network pass each for NPE, MCMC
chains each for NLE and NRE (50 × 100 two_moons samples took 60 s of one core), so they run
for amortized methods only (and not for NPSE: ``Method.calibration_skipped``). The posterior
samples on the
training device where the prior can follow it there (``SimulationSource.posterior_device``):
SBC's 200 × 1,000 draws from a spline flow take about 10 s of one CPU core, and every SBI run
waited for them after its last step. The classifier of C2ST, the ranks and plots stay on the CPU.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from trainforge.log import say
from trainforge.workloads.sbi import calibration, methods
from trainforge.workloads.sbi.sources import SimulationSource


def posterior_of(
    estimator: nn.Module,
    source: SimulationSource,
    device: torch.device | str = "cpu",
    method: str = "npe",
    sampling: dict[str, Any] | None = None,
) -> Any:
    """sbi's posterior of ``estimator`` as ``method`` makes it (moved to ``device``, with the
    prior built there); ``sampling``: its MCMC settings (``export.sampling_of``)."""
    return methods.get(method).posterior(
        estimator.to(device).eval(), source.prior_distribution(device), sampling or {},
        str(device),
    )  # fmt: skip


def run(
    estimator: nn.Module,
    source: SimulationSource,
    cfg: Any,
    seed: int,
    folder: Path,
    device: torch.device | None = None,
    method: str = "npe",
    sampling: dict[str, Any] | None = None,
) -> tuple[dict[str, float], list[Path]]:
    """Metrics (``c2st/obs<k>``, ``c2st/mean``, ``sbc/…``) and the figures written to
    ``folder``; the posterior samples on ``device`` (the training device; None: the CPU)
    where the source allows it."""
    device = source.posterior_device(device or torch.device("cpu"))
    posterior = posterior_of(estimator, source, device, method, sampling)
    return run_posterior(posterior, source, cfg, seed, folder, device, method)


def run_posterior(
    posterior: Any,
    source: SimulationSource,
    cfg: Any,
    seed: int,
    folder: Path,
    device: torch.device | None = None,
    method: str = "npe",
) -> tuple[dict[str, float], list[Path]]:
    """``run``'s evaluation of any sbi posterior of ``method`` on ``device`` (an ensemble's,
    on the CPU)."""
    from trainforge.workloads.sbi.observations import Observations

    device = device or torch.device("cpu")
    started_at = time.perf_counter()
    metrics: dict[str, float] = {}
    files: list[Path] = []
    scores = []
    labels = [f"θ{i + 1}" for i in range(source.dim_theta)]
    task = source.task
    # observations exist for benchmark tasks only
    observed = Observations.of(task, cfg) if task is not None and cfg.observations else None
    numbers = list(cfg.observations) if observed is not None else []
    if observed is not None:
        files.append(observed.write(numbers, folder / "observations.json"))
    calibrate = calibrates(cfg, method)
    announce(numbers, observed.label if observed is not None else "", cfg, calibrate)
    for rank, number in enumerate(numbers):
        assert observed is not None
        theta_true, x_obs = observed.observation(number)
        torch.manual_seed(seed + number)
        np.random.seed(seed + number)  # sbi's slice samplers draw from numpy's global RNG
        samples = posterior.sample(
            (cfg.num_samples,), x=x_obs.to(device), show_progress_bars=False
        ).cpu()
        sets = {method.upper(): samples}
        if cfg.c2st:
            started = time.perf_counter()
            score, reference = scored(observed, number, samples, cfg, seed)
            metrics[f"c2st/obs{number}"] = score
            metrics["c2st/seconds"] = metrics.get("c2st/seconds", 0.0) + (
                time.perf_counter() - started
            )
            scores.append(score)
            sets[f"reference ({observed.label})"] = reference
            say(
                f"evaluation: {observed.label} observation {number} ({rank + 1}/{len(numbers)}): "
                f"c2st {score:.3f} ({time.perf_counter() - started:.0f} s)"
            )
        if cfg.pair_plot and rank == 0:
            path = folder / f"pair_plot_obs{number}.png"
            calibration.pair_plot(sets, path, theta_true=theta_true, labels=labels)
            files.append(path)
    if scores:
        metrics["c2st/mean"] = sum(scores) / len(scores)
    if calibrate:
        calibrated, figures = sbc(posterior, source, cfg, seed, folder, labels, device)
        metrics |= calibrated
        files += figures
    conclude(metrics, numbers, observed.label if observed is not None else "", cfg,
             time.perf_counter() - started_at)  # fmt: skip
    return metrics, files


def scored(
    observed: Any, number: int, samples: torch.Tensor, cfg: Any, seed: int
) -> tuple[float, torch.Tensor]:
    """C2ST of ``samples`` against the reference samples at observation ``number``, and those
    reference samples."""
    from trainforge.workloads.sbi.c2st import c2st, fold_processes, usable_processes

    reference = observed.reference(number, cfg.num_samples, seed=seed + number)
    # equal counts on both sides (sbibm stores 10,000), so that chance scores 0.5
    # the folds on the machine's idle cores: training is over
    processes = fold_processes(len(reference), reference.shape[1], usable_processes())
    # a random subset when there are more: an ensemble's draws come member by member
    subset = torch.randperm(len(samples), generator=torch.Generator().manual_seed(seed))
    compared = samples[subset[: len(reference)]] if len(samples) > len(reference) else samples
    return c2st(reference, compared, seed=seed, processes=processes), reference


def calibrates(cfg: Any, method: str) -> bool:
    """Whether SBC and TARP run: asked for, the posterior amortized and the method's sampler
    cheap enough at many x (otherwise one line says why not)."""
    chosen = methods.get(method)
    why = chosen.calibration_skipped or (
        None if chosen.amortized else "runs MCMC chains at each of those observations")  # fmt: skip
    if cfg.sbc_runs > 0 and why is not None:
        say(f"evaluation: SBC and TARP skipped (workload.evaluation.sbc_runs {cfg.sbc_runs}): "
            f"method {method}'s posterior {why}; sbc_runs 0 asks for none")  # fmt: skip
    return cfg.sbc_runs > 0 and why is None


def announce(numbers: list[int], label: str, cfg: Any, calibrate: bool = True) -> None:
    """One line before the evaluation's work: a C2ST can take minutes, and until its result
    the console would show nothing. Nothing asked, nothing said."""
    parts = []
    if numbers:
        which = f"observation{'s' if len(numbers) != 1 else ''} {', '.join(map(str, numbers))}"
        parts.append(
            f"the posterior at {label} {which}"
            + (", C2ST against reference samples" if cfg.c2st else "")
        )
    if calibrate and cfg.sbc_runs > 0:
        parts.append(f"SBC over {cfg.sbc_runs} runs")
    if parts:
        say("evaluation: " + "; ".join(parts))


def conclude(metrics: dict[str, float], numbers: list[int], label: str, cfg: Any,
             seconds: float) -> None:  # fmt: skip
    """The evaluation's last line: its outcome in words, each number once (the closing table
    and MLflow hold every metric). Nothing asked, nothing said."""
    parts = []
    if "c2st/mean" in metrics:
        parts.append(
            f"C2ST {metrics['c2st/mean']:.3f} at {label} observation {numbers[0]}"
            if len(numbers) == 1
            else f"C2ST mean {metrics['c2st/mean']:.3f} over {len(numbers)} {label} observations"
        )
        parts[-1] += " (0.5: its samples cannot be told from the reference's)"
    if "sbc/ks_pvalue_min" in metrics:
        parts.append(
            f"SBC over {cfg.sbc_runs} runs: smallest rank KS p-value "
            f"{metrics['sbc/ks_pvalue_min']:.3f}, largest rank ECDF deviation "
            f"{metrics['sbc/max_ecdf_deviation']:.3f}"
        )
    if "tarp/atc" in metrics:
        parts.append(f"TARP ATC {metrics['tarp/atc']:+.3f} (0: calibrated)")
    if parts:
        say(f"evaluation done in {seconds:.0f} s: " + "; ".join(parts))


def sbc(
    posterior: Any,
    source: SimulationSource,
    cfg: Any,
    seed: int,
    folder: Path,
    labels: list[str],
    device: torch.device,
) -> tuple[dict[str, float], list[Path]]:
    """SBC and TARP (sbi's, ``calibration``) on fresh (θ, x) prior predictive pairs: their
    metrics and figures."""
    generator = torch.Generator().manual_seed(seed + 10_007)
    torch.manual_seed(seed + 10_007)  # user priors draw from the global RNG
    with torch.no_grad():
        theta = source.sample_prior(cfg.sbc_runs, generator)
        x = source.simulate(theta, generator)
    keep = torch.isfinite(x).all(dim=1)
    theta, x = theta[keep].to(device), x[keep].to(device)
    ranks, metrics = calibration.sbc(posterior, theta, x, cfg.sbc_samples)
    files = calibration.plot_sbc(ranks, cfg.sbc_samples, folder, labels)
    metrics |= calibration.tarp(posterior, theta, x, folder / "tarp.png", seed=seed + 10_009)
    return metrics, [*files, folder / "tarp.png"]


def evaluate_ensemble(
    posterior: Path, workload: Any, seed: int, folder: Path
) -> tuple[dict[str, float], list[Path]]:
    """The recipe's evaluation (C2ST at its observations, SBC, pair plot) of the ensemble's
    posterior, on this machine's CPU: the number the ensemble is for
    (``driver/ensemble_run.py``)."""
    evaluation = workload.evaluation
    if not evaluation.observations and evaluation.sbc_runs == 0:
        return {}, []
    from trainforge.workloads.sbi import export, sources

    say("ensemble: evaluating the mixture of the members' posteriors (on this CPU)")
    folder.mkdir(parents=True, exist_ok=True)
    return run_posterior(export.load_posterior(posterior), sources.resolve(workload),
                         evaluation, seed, folder, method=workload.method)  # fmt: skip
