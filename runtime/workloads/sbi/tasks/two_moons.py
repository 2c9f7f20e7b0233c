"""two_moons (sbibm): a crescent-shaped likelihood whose posterior is two crescents.

Simulator: a ~ U(-π/2, π/2), r ~ N(0.1, 0.01²), p = (r cos a + 0.25, r sin a), and
x = p + (-|θ1 + θ2| / √2, (θ2 - θ1) / √2).

Likelihood by change of variables. Write g(θ) = (-|θ1 + θ2| / √2, (θ2 - θ1) / √2) and
u = x - (0.25, 0) - g(θ) = (r cos a, r sin a). For fixed θ the map (r, a) → u with r ∈ R and
a ∈ (-π/2, π/2) is one-to-one (for u1 > 0: r = |u|, a = atan(u2 / u1); for u1 < 0: r = -|u|) and
its Jacobian is |det ∂u/∂(r, a)| = |r|. Hence

    p(x | θ) = N(sign(u1) |u|; 0.1, 0.01²) · (1/π) / |u|.

The r < 0 branch carries a mass of ~1e-23 but keeps the density exactly normalised.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from trainforge.workloads.sbi.tasks.base import BoxUniformPriorMixin, Task

MOON_RADIUS_MEAN = 0.1
MOON_RADIUS_STD = 0.01
MOON_OFFSET = 0.25
_SQRT2 = math.sqrt(2.0)


class TwoMoons(BoxUniformPriorMixin, Task):
    name = "two_moons"
    dim_theta = 2
    dim_x = 2
    low = -1.0
    high = 1.0

    def noise(
        self, n: int, generator: torch.Generator | None, device: torch.device, dtype: torch.dtype
    ) -> Tensor:
        """u = (r cos a, r sin a) + (0.25, 0): the θ-independent part of x, ``[n, 2]``."""
        a = (torch.rand(n, generator=generator, device=device, dtype=dtype) - 0.5) * math.pi
        r = MOON_RADIUS_MEAN + MOON_RADIUS_STD * torch.randn(
            n, generator=generator, device=device, dtype=dtype
        )
        return torch.stack((r * torch.cos(a) + MOON_OFFSET, r * torch.sin(a)), dim=-1)

    @staticmethod
    def shift(theta: Tensor) -> Tensor:
        """g(θ) = (-|θ1 + θ2| / √2, (θ2 - θ1) / √2): a rotation by -45° and a fold."""
        z0 = (theta[..., 0] + theta[..., 1]) / _SQRT2
        z1 = (theta[..., 1] - theta[..., 0]) / _SQRT2
        return torch.stack((-z0.abs(), z1), dim=-1)

    @staticmethod
    def unshift(v: Tensor, branch: Tensor) -> Tensor:
        """The θ with g(θ) = v on the chosen branch (``branch`` = ±1 is the sign of θ1 + θ2).

        Only meaningful where v1 ≤ 0 (g's first coordinate is never positive)."""
        z0 = branch * (-v[..., 0])
        z1 = v[..., 1]
        return torch.stack(((z0 - z1) / _SQRT2, (z0 + z1) / _SQRT2), dim=-1)

    def _simulate(self, theta: Tensor, generator: torch.Generator | None) -> Tensor:
        return self.noise(theta.shape[0], generator, theta.device, theta.dtype) + self.shift(theta)

    def _log_likelihood(self, theta: Tensor, x: Tensor) -> Tensor:
        u = x - self.shift(theta)
        u = torch.stack((u[..., 0] - MOON_OFFSET, u[..., 1]), dim=-1)
        radius = torch.linalg.vector_norm(u, dim=-1).clamp_min(torch.finfo(u.dtype).tiny)
        signed_radius = torch.where(u[..., 0] < 0, -radius, radius)
        z = (signed_radius - MOON_RADIUS_MEAN) / MOON_RADIUS_STD
        log_normal = -0.5 * z.square() - math.log(MOON_RADIUS_STD * math.sqrt(2 * math.pi))
        return log_normal - math.log(math.pi) - torch.log(radius)
