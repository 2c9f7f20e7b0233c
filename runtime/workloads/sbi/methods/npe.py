"""Neural posterior estimation: the estimator is the posterior q(θ | x), sampled directly by
sbi's ``DirectPosterior`` (which rejects samples outside the prior's support)."""

from __future__ import annotations

from typing import Any

from trainforge.workloads.sbi.methods.base import Method


def _builder() -> Any:
    from sbi.neural_nets import posterior_nn

    return posterior_nn


def _posterior(estimator: Any, prior: Any, sampling: dict[str, Any], device: str) -> Any:
    from sbi.inference import DirectPosterior

    return DirectPosterior(posterior_estimator=estimator, prior=prior, device=device)


METHOD = Method(
    name="npe",
    learns="the posterior q(θ | x)",
    input="theta",
    embeds_x=True,
    amortized=True,
    builder=_builder,
    posterior=_posterior,
    proposes="truncated_prior",
)
