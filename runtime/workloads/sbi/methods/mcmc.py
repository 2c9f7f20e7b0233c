"""The posterior of the methods that sample by MCMC (nle, nre, nre_c): sbi's ``MCMCPosterior``
over a potential, its chains set by ``workload.posterior`` as the exported file keeps them
(sbi's defaults where a file keeps none)."""

from __future__ import annotations

from typing import Any


def posterior(potential: Any, transform: Any, prior: Any, sampling: dict[str, Any],
              device: str) -> Any:  # fmt: skip
    """sbi's ``MCMCPosterior`` of ``potential`` (log q(x_o | θ) or log r(x_o, θ), plus the
    prior's), sampled in the prior's unconstrained space (``transform``), proposals from the
    prior."""
    from sbi.inference import MCMCPosterior

    return MCMCPosterior(
        potential, proposal=prior, theta_transform=transform, device=device,
        method=sampling.get("mcmc_method", "slice_np_vectorized"),
        num_chains=int(sampling.get("num_chains", 20)),
        warmup_steps=int(sampling.get("warmup_steps", 200)),
        thin=int(sampling.get("thin", 1)),
    )  # fmt: skip
