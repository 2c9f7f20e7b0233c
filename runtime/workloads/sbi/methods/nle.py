"""Neural likelihood estimation: the estimator is the likelihood q(x | θ), and the posterior
is sbi's ``MCMCPosterior`` over q(x_o | θ) p(θ), sampled by MCMC in the prior's unconstrained
space (sbi's transform) from chains started by sampling-importance-resampling of prior draws.
Every observation is a fresh MCMC run: not amortized."""

from __future__ import annotations

from typing import Any

from trainforge.workloads.sbi.methods.base import Method


def _builder() -> Any:
    from sbi.neural_nets import likelihood_nn

    return likelihood_nn


def _posterior(estimator: Any, prior: Any, sampling: dict[str, Any], device: str) -> Any:
    from sbi.inference import MCMCPosterior, likelihood_estimator_based_potential

    potential, transform = likelihood_estimator_based_potential(estimator, prior, x_o=None)
    return MCMCPosterior(
        potential, proposal=prior, theta_transform=transform, device=device,
        method=sampling.get("mcmc_method", "slice_np_vectorized"),
        num_chains=int(sampling.get("num_chains", 20)),
        warmup_steps=int(sampling.get("warmup_steps", 200)),
        thin=int(sampling.get("thin", 1)),
    )  # fmt: skip


METHOD = Method(
    name="nle",
    learns="the likelihood q(x | θ)",
    input="x",
    embeds_x=False,
    amortized=False,
    builder=_builder,
    posterior=_posterior,
)
