"""An SBI problem of your own for trainforge: a damped oscillator observed at 40 time points,
with an embedding net of your own that reads the series with 1-d convolutions. trainforge
simulates it (over the cluster where there is one), trains a neural posterior estimator on it
with DDP workers, checkpoints and MLflow, and hands back sbi's posterior.

    trainforge train recipe.yaml        (run from this folder)

- θ = (ω, ζ): the natural frequency and the damping ratio, uniform over [0.5, 3] × [0.05, 0.5].
- x: the displacement exp(−ζωt) cos(ω√(1−ζ²) t) at t = 0, 0.25, … 9.75, plus Gaussian noise
  (σ = 0.05) drawn from torch's global generator, which the simulation stage seeds per chunk.

Outside trainforge these are an ordinary sbi prior, simulator and embedding net:
``NPE(prior(), density_estimator=posterior_nn("maf", embedding_net=Features(40)))``.
"""

from __future__ import annotations

import torch
from torch import nn

TIMES = torch.arange(40) * 0.25
NOISE = 0.05


def prior() -> torch.distributions.Distribution:
    low, high = torch.tensor([0.5, 0.05]), torch.tensor([3.0, 0.5])
    return torch.distributions.Independent(torch.distributions.Uniform(low, high), 1)


def simulate(theta: torch.Tensor) -> torch.Tensor:
    """x [n, 40] for θ [n, 2], all rows at once (``vectorized: true`` in the recipe)."""
    omega, zeta = theta[:, :1], theta[:, 1:]
    damped = omega * torch.sqrt(1 - zeta**2)
    x = torch.exp(-zeta * omega * TIMES) * torch.cos(damped * TIMES)
    return x + NOISE * torch.randn_like(x)


class Features(nn.Module):
    """The series to ``features`` numbers: two 1-d convolutions over time, pooled, then a
    linear layer. trainforge gives it ``dim_x`` (the series' length) and the recipe's
    ``embedding_kwargs``."""

    def __init__(self, dim_x: int, features: int = 8, channels: int = 8) -> None:
        super().__init__()
        self.convolutions = nn.Sequential(
            nn.Unflatten(1, (1, dim_x)),
            nn.Conv1d(1, channels, kernel_size=5, padding=2), nn.GELU(),
            nn.Conv1d(channels, channels, kernel_size=5, padding=2, stride=2), nn.GELU(),
            nn.AdaptiveAvgPool1d(5), nn.Flatten(),
        )  # fmt: skip
        self.head = nn.Linear(channels * 5, features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.convolutions(x))
