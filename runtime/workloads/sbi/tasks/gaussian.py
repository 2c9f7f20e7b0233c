"""The two Gaussian tasks of sbibm.

gaussian_linear: θ ∈ R¹⁰ ~ N(0, 0.1·I), x ~ N(θ, 0.1·I) — conjugate, so its posterior is the
Gaussian N(0.5·x, 0.05·I) (precisions add: 10 + 10).

gaussian_mixture: θ ∈ R² uniform on [-10, 10]², x ~ 0.5·N(θ, I) + 0.5·N(θ, 0.01·I) — a broad and
a narrow component around the same centre; the posterior is the same mixture around x, cut to
the prior box.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from trainforge.workloads.sbi.tasks.base import (
    BoxUniformPriorMixin,
    Task,
    gaussian_log_density,
    generator_device,
)


class GaussianLinear(Task):
    name = "gaussian_linear"
    dim_theta = 10
    dim_x = 10
    prior_variance = 0.1
    noise_variance = 0.1

    def prior_sample(
        self, n: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32
    ) -> Tensor:
        z = torch.randn(
            n, self.dim_theta, generator=generator, device=generator_device(generator), dtype=dtype
        )
        return math.sqrt(self.prior_variance) * z

    def prior_log_prob(self, theta: Tensor) -> Tensor:
        return gaussian_log_density(theta, self.prior_variance)

    def prior_distribution(
        self, device: torch.device | str = "cpu"
    ) -> torch.distributions.Distribution:
        covariance = self.prior_variance * torch.eye(self.dim_theta, device=device)
        zeros = torch.zeros(self.dim_theta, device=device)
        return torch.distributions.MultivariateNormal(zeros, covariance)

    def _simulate(self, theta: Tensor, generator: torch.Generator | None) -> Tensor:
        noise = torch.randn(
            theta.shape, generator=generator, device=theta.device, dtype=theta.dtype
        )
        return theta + math.sqrt(self.noise_variance) * noise

    def _log_likelihood(self, theta: Tensor, x: Tensor) -> Tensor:
        return gaussian_log_density(x - theta, self.noise_variance)

    def posterior_mean_variance(self, x_obs: Tensor) -> tuple[Tensor, float]:
        """The exact posterior: mean ``[dim_theta]`` and the (isotropic) variance."""
        precision = 1.0 / self.prior_variance + 1.0 / self.noise_variance
        variance = 1.0 / precision
        return variance * x_obs.reshape(-1) / self.noise_variance, variance


class GaussianMixture(BoxUniformPriorMixin, Task):
    name = "gaussian_mixture"
    dim_theta = 2
    dim_x = 2
    low = -10.0
    high = 10.0
    # (weight, standard deviation) of the two components, both centred on θ
    components = ((0.5, 1.0), (0.5, 0.1))

    def component_noise(
        self, n: int, generator: torch.Generator | None, device: torch.device, dtype: torch.dtype
    ) -> Tensor:
        """x - θ for ``n`` draws: pick a component, then scale a standard normal, ``[n, 2]``."""
        # Inverse-CDF pick of the component: one uniform per draw, cheap on a GPU at 10^7 draws.
        upper = torch.tensor([w for w, _ in self.components], device=device, dtype=dtype).cumsum(0)
        stds = torch.tensor([s for _, s in self.components], device=device, dtype=dtype)
        u = torch.rand(n, generator=generator, device=device, dtype=dtype)
        pick = torch.searchsorted(upper[:-1], u, right=True)
        z = torch.randn(n, self.dim_x, generator=generator, device=device, dtype=dtype)
        return stds[pick].unsqueeze(-1) * z

    def _simulate(self, theta: Tensor, generator: torch.Generator | None) -> Tensor:
        return theta + self.component_noise(theta.shape[0], generator, theta.device, theta.dtype)

    def _log_likelihood(self, theta: Tensor, x: Tensor) -> Tensor:
        residual = x - theta
        terms = [math.log(w) + gaussian_log_density(residual, s * s) for w, s in self.components]
        return torch.logsumexp(torch.stack(terms), dim=0)
