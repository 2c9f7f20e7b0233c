"""bernoulli_glm (sbibm): a spiking neuron as a Bernoulli GLM with a logistic link.

θ = (b, w1..w9): an intercept and a 9-tap linear filter on a white-noise stimulus I of 100 time
bins. The design matrix V (100 × 10) has rows (1, I_t, I_{t-1}, …, I_{t-8}) with I_t = 0 for
t < 0; the spike train is y_t ~ Bernoulli(σ(V_t · θ)). x = Vᵀy: the spike count followed by the
nine stimulus-weighted spike sums (sbibm computes the same numbers as a convolution, its
"spike-triggered average"). These are the GLM's sufficient statistics.

Prior: θ ~ N(0, B⁻¹) with precision B = diag(0.5, FᵀF), F = D² + diag(√(i/9)) for i = 0..8 and
D the first-difference matrix (1 on the diagonal, -1 below it): a smoothness prior on the
filter and a variance-2 prior on the intercept.

Likelihood: p(y | θ) = exp(θᵀVᵀy - Σ_t log(1 + exp(V_t·θ))) depends on y only through x, so
log_likelihood(θ, x) = θᵀx - Σ_t softplus(V_t·θ). As a function of θ this equals log p(x | θ) up
to a θ-free constant (log #{y : Vᵀy = x}), which is all a posterior needs; for a continuous
stimulus the map y → x is almost surely one-to-one and the constant is 0.

The stimulus is sbibm's own: N(0, 1) white noise from numpy's legacy ``RandomState(42)``, cast to
float32, as sbibm drew it (its stored ``design_matrix.pt`` equals this matrix bit for bit, and
x = Vᵀy reproduces its ten stored observations from their spike trains; see
``sbibm_data``). With it, the simulator, prior and likelihood are sbibm's bernoulli_glm.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from trainforge.workloads.sbi.tasks.base import Task, generator_device

NUM_BINS = 100
FILTER_TAPS = 9
STIMULUS_SEED = 42


def stimulus(num_bins: int = NUM_BINS, seed: int = STIMULUS_SEED) -> Tensor:
    """sbibm's white-noise stimulus I, float32 values in float64 ``[num_bins]``."""
    # numpy's legacy RandomState stream is frozen across numpy versions (NEP 19), so this is
    # sbibm's stimulus on every machine
    values = np.random.RandomState(seed).randn(num_bins).astype(np.float32)
    return torch.from_numpy(values).to(torch.float64)


def design_matrix(num_bins: int = NUM_BINS, seed: int = STIMULUS_SEED) -> Tensor:
    """V, float64 ``[num_bins, 1 + FILTER_TAPS]``: an intercept column and lagged stimulus."""
    stimulus_values = stimulus(num_bins, seed)
    v = torch.zeros(num_bins, 1 + FILTER_TAPS, dtype=torch.float64)
    v[:, 0] = 1.0
    for lag in range(FILTER_TAPS):
        v[lag:, 1 + lag] = stimulus_values[: num_bins - lag]
    return v


def prior_precision() -> Tensor:
    """B, float64 ``[10, 10]`` (see the module docstring)."""
    m = FILTER_TAPS
    d = torch.eye(m, dtype=torch.float64) - torch.diag(torch.ones(m - 1, dtype=torch.float64), -1)
    f = d @ d + torch.diag(torch.sqrt(torch.arange(m, dtype=torch.float64) / m))
    b = torch.zeros(m + 1, m + 1, dtype=torch.float64)
    b[0, 0] = 0.5
    b[1:, 1:] = f.T @ f
    return b


class BernoulliGLM(Task):
    name = "bernoulli_glm"
    dim_theta = 1 + FILTER_TAPS
    dim_x = 1 + FILTER_TAPS
    # 2: sbibm's stimulus (numpy's RandomState) replaced a torch-generated one
    revision = 2

    def __init__(self) -> None:
        super().__init__()
        self.design = design_matrix()
        self.precision = prior_precision()
        # θ = L z with L Lᵀ = B⁻¹ turns standard normals into prior draws.
        self.prior_scale_tril = torch.linalg.cholesky(torch.linalg.inv(self.precision))
        self._log_normalizer = 0.5 * torch.logdet(self.precision).item() - 0.5 * self.dim_theta * (
            math.log(2 * math.pi)
        )

    def prior_sample(
        self, n: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32
    ) -> Tensor:
        z = torch.randn(
            n, self.dim_theta, generator=generator, device=generator_device(generator), dtype=dtype
        )
        return z @ self._constant("scale_tril", self.prior_scale_tril, z).T

    def prior_distribution(
        self, device: torch.device | str = "cpu"
    ) -> torch.distributions.Distribution:
        zeros = torch.zeros(self.dim_theta, device=device)
        scale_tril = self.prior_scale_tril.to(device, torch.float32)  # computed in float64
        return torch.distributions.MultivariateNormal(zeros, scale_tril=scale_tril)

    def prior_log_prob(self, theta: Tensor) -> Tensor:
        b = self._constant("precision", self.precision, theta)
        return -0.5 * ((theta @ b) * theta).sum(-1) + self._log_normalizer

    def _simulate(self, theta: Tensor, generator: torch.Generator | None) -> Tensor:
        v = self._constant("design", self.design, theta)
        rate = torch.sigmoid(theta @ v.T)  # [n, bins]
        u = torch.rand(rate.shape, generator=generator, device=theta.device, dtype=theta.dtype)
        spikes = (u < rate).to(theta.dtype)
        return spikes @ v

    def _log_likelihood(self, theta: Tensor, x: Tensor) -> Tensor:
        v = self._constant("design", self.design, theta)
        return (theta * x).sum(-1) - F.softplus(theta @ v.T).sum(-1)
