"""slcp (sbibm): "simple likelihood, complex posterior".

θ ∈ R⁵ uniform on [-3, 3]⁵. x ∈ R⁸ holds four iid 2-d Gaussian draws, (x1, x2), (x3, x4), …,
with mean (θ1, θ2), standard deviations s1 = θ3², s2 = θ4² and correlation ρ = tanh(θ5):
Σ = [[s1², ρ s1 s2], [ρ s1 s2, s2²]] + 1e-6·I (sbibm adds the 1e-6 so Σ stays positive definite
when θ3 or θ4 is near 0). The likelihood is a plain Gaussian; the posterior is not: flipping the
sign of θ3 or θ4 changes nothing, so it has four symmetric modes.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from trainforge.workloads.sbi.tasks.base import BoxUniformPriorMixin, Task

NUM_DRAWS = 4
JITTER = 1e-6


def _covariance(theta: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Σ11, Σ12, Σ22 and det Σ, each ``[n]``."""
    s1 = theta[..., 2].square()
    s2 = theta[..., 3].square()
    rho = torch.tanh(theta[..., 4])
    c11 = s1.square() + JITTER
    c22 = s2.square() + JITTER
    c12 = rho * s1 * s2
    # det = s1² s2² (1 - ρ²) + jitter terms, with 1 - ρ² = 1/cosh²(θ5): no cancellation when
    # |ρ| → 1, which c11·c22 - c12² would suffer in float32.
    one_minus_rho2 = torch.cosh(theta[..., 4]).pow(-2)
    det = (s1 * s2).square() * one_minus_rho2 + JITTER * (c11 + c22 - JITTER)
    return c11, c12, c22, det


class SLCP(BoxUniformPriorMixin, Task):
    name = "slcp"
    dim_theta = 5
    dim_x = 2 * NUM_DRAWS
    low = -3.0
    high = 3.0

    def _simulate(self, theta: Tensor, generator: torch.Generator | None) -> Tensor:
        c11, c12, c22, _ = _covariance(theta)
        # Cholesky factor of the 2×2 covariance, written out so it vectorises over any batch.
        l11 = c11.sqrt()
        l21 = c12 / l11
        l22 = (c22 - l21.square()).clamp_min(0.0).sqrt()
        n = theta.shape[0]
        z = torch.randn(
            n, NUM_DRAWS, 2, generator=generator, device=theta.device, dtype=theta.dtype
        )
        first = theta[:, 0:1] + l11.unsqueeze(-1) * z[..., 0]
        second = theta[:, 1:2] + l21.unsqueeze(-1) * z[..., 0] + l22.unsqueeze(-1) * z[..., 1]
        # sbibm's layout: draw-major, i.e. (x1, x2) is the first draw.
        return torch.stack((first, second), dim=-1).reshape(n, self.dim_x)

    def _log_likelihood(self, theta: Tensor, x: Tensor) -> Tensor:
        c11, c12, c22, det = _covariance(theta)
        pairs = x.reshape(*x.shape[:-1], NUM_DRAWS, 2)
        d1 = pairs[..., 0] - theta[..., 0:1]
        d2 = pairs[..., 1] - theta[..., 1:2]
        c11, c12, c22, det = (t.unsqueeze(-1) for t in (c11, c12, c22, det))
        quadratic = (c22 * d1.square() - 2 * c12 * d1 * d2 + c11 * d2.square()) / det
        per_draw = -0.5 * quadratic - 0.5 * torch.log(det) - math.log(2 * math.pi)
        return per_draw.sum(-1)
