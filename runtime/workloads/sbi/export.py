"""The trained posterior as one file an ``sbi`` user opens as sbi's posterior object of the
run's method: a ``DirectPosterior`` for NPE, an ``MCMCPosterior`` over the likelihood (NLE) or
the ratio (NRE), a ``VectorFieldPosterior`` for FMPE and NPSE (``methods/``).

``posterior.pt`` holds plain data only — the build record (with the method), the state dict,
how to get the prior (a task name or an import path) and, for a method that samples by MCMC,
its settings (``workload.posterior``) — so it loads with ``torch.load(weights_only=True)``:

    from trainforge.workloads.sbi import load_posterior
    posterior = load_posterior("runs/two_moons_npe_1e4/posterior.pt")
    samples = posterior.sample((1000,), x=x_obs)
    log_density = posterior.log_prob(samples, x=x_obs)

Several such files (runs of other seeds) combine into one with ``trainforge ensemble``
(``ensemble.py``); ``load_posterior`` opens that as sbi's ``EnsemblePosterior``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainforge.atomic import replacing
from trainforge.workloads.sbi import ensemble, methods
from trainforge.workloads.sbi import estimator as estimators

FORMAT = "trainforge-npe/1"


def prior_spec(cfg: Any) -> dict[str, str]:
    """How to recreate the recipe's prior without pickling it."""
    if cfg.task == "custom":
        return {"import": cfg.prior, "code_dir": cfg.code_dir or ""}
    return {"task": cfg.task}


def prior_from_spec(spec: dict[str, str], device: str = "cpu") -> torch.distributions.Distribution:
    """The prior (a built-in task's on ``device``; a user's where its code puts it)."""
    from trainforge.workloads.sbi.sources import load_prior
    from trainforge.workloads.sbi.tasks import get_task

    if "task" in spec:
        return get_task(spec["task"]).prior_distribution(device)
    return load_prior(spec["import"], spec.get("code_dir") or None)


def sampling_of(cfg: Any) -> dict[str, Any]:
    """The recipe's ``workload.posterior`` settings, as the bundle keeps them."""
    section = cfg.posterior
    return {"mcmc_method": str(section.mcmc_method), "num_chains": int(section.num_chains),
            "warmup_steps": int(section.warmup_steps), "thin": int(section.thin)}  # fmt: skip


def save_posterior(
    path: Path, estimator: nn.Module, record: estimators.BuildRecord, prior: dict[str, str],
    sampling: dict[str, Any] | None = None,
) -> None:  # fmt: skip
    """Write atomically: a reader never sees half a file."""
    bundle = {
        "format": FORMAT,
        "build": record.to_dict(),
        "state_dict": {k: v.detach().cpu() for k, v in estimator.state_dict().items()},
        "prior": prior,
        "sampling": dict(sampling or {}),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as temporary:
        torch.save(bundle, temporary)


def load_estimator(path: str | Path) -> tuple[nn.Module, dict[str, Any]]:
    """The density estimator (eval mode, CPU) and the bundle it came from."""
    bundle = torch.load(Path(path), map_location="cpu", weights_only=True)
    if not isinstance(bundle, dict) or bundle.get("format") != FORMAT:
        raise ValueError(f"{path} is not a trainforge posterior file ({FORMAT})")
    return _estimator(bundle), bundle


def _estimator(bundle: dict[str, Any]) -> nn.Module:
    record = estimators.BuildRecord(**bundle["build"])
    return estimators.rebuild(record, bundle["state_dict"]).eval()


def load_posterior(path: str | Path, device: str = "cpu") -> Any:
    """sbi's posterior (``sample``, ``log_prob``, ``map`` …) from ``posterior.pt``, on the CPU
    or ``device``: a ``DirectPosterior`` (NPE) or an ``MCMCPosterior`` (NLE); from an ensemble
    file (``trainforge ensemble``), sbi's ``EnsemblePosterior`` of its members (on the CPU)."""
    bundle = torch.load(Path(path), map_location="cpu", weights_only=True)
    if isinstance(bundle, dict) and bundle.get("format") == ensemble.FORMAT:
        return ensemble.ensemble_posterior(bundle, _posterior)
    if not isinstance(bundle, dict) or bundle.get("format") != FORMAT:
        raise ValueError(f"{path} is not a trainforge posterior file ({FORMAT})")
    return _posterior(bundle, device)


def _posterior(bundle: dict[str, Any], device: str = "cpu") -> Any:
    method = methods.get(bundle["build"].get("method", "npe"))
    prior = prior_from_spec(bundle["prior"], device)
    estimator = _estimator(bundle).to(device)
    return method.posterior(estimator, prior, bundle.get("sampling", {}), device)
