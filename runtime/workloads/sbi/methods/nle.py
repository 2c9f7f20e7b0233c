"""Neural likelihood estimation: the estimator is the likelihood q(x | θ), and the posterior
is sbi's ``MCMCPosterior`` over q(x_o | θ) p(θ), sampled by MCMC in the prior's unconstrained
space (sbi's transform) from chains started by sampling-importance-resampling of prior draws.
Every observation is a fresh MCMC run: not amortized."""

from __future__ import annotations

from typing import Any

from trainforge.workloads.sbi.methods import mcmc
from trainforge.workloads.sbi.methods.base import Method


def _builder() -> Any:
    from sbi.neural_nets import likelihood_nn

    return likelihood_nn


def _posterior(estimator: Any, prior: Any, sampling: dict[str, Any], device: str) -> Any:
    from sbi.inference import likelihood_estimator_based_potential

    potential, transform = likelihood_estimator_based_potential(estimator, prior, x_o=None)
    return mcmc.posterior(potential, transform, prior, sampling, device)


METHOD = Method(
    name="nle",
    learns="the likelihood q(x | θ)",
    input="x",
    embeds_x=False,
    amortized=False,
    builder=_builder,
    posterior=_posterior,
    proposes="posterior",
)
