"""An epidemic (SIR) model whose every simulation is an ODE solved by SciPy: a CPU-bound
simulator of the kind users bring, a few milliseconds of one core per parameter set, run one
row at a time — nothing vectorised.

- θ = (β, γ): the contact rate and the recovery rate, with sbibm's SIR prior
  β ~ LogNormal(log 0.4, 0.5), γ ~ LogNormal(log 1/8, 0.2).
- The model: a population of one million with one infected person on day 0,
  ds/dt = −β s i, di/dt = β s i − γ i, dr/dt = γ i (shares of the population), days 0..160.
- x: the summary statistics, the share infected on 10 evenly spaced days, each as measured by
  testing 1,000 people (binomial noise, from NumPy's global RNG: the simulation stage seeds it
  per chunk, sbi's ``simulate_for_sbi`` per batch).

A recipe: ``recipes/sbi/sir_custom.yaml``. Outside trainforge it is an ordinary sbi simulator:
``simulate_for_sbi(simulate, prior(), 1000, num_workers=8)`` (θ may be a tensor or an array).
"""

from __future__ import annotations

import numpy as np
import torch
from scipy.integrate import solve_ivp

POPULATION = 1_000_000
DAYS = 160.0
OBSERVED_DAYS = np.linspace(0.0, DAYS, 11)[1:]  # days 16, 32, … 160
TESTED = 1000  # people tested on each observed day


def prior() -> torch.distributions.Distribution:
    """sbibm's SIR prior over (β, γ)."""
    loc = torch.tensor([np.log(0.4), np.log(1 / 8)], dtype=torch.float32)
    scale = torch.tensor([0.5, 0.2])
    return torch.distributions.Independent(torch.distributions.LogNormal(loc, scale), 1)


def _rates(_t: float, y: np.ndarray, beta: float, gamma: float) -> list[float]:
    s, i, _ = y
    infections = beta * s * i
    return [-infections, infections - gamma * i, gamma * i]


def infected(beta: float, gamma: float) -> np.ndarray:
    """The share infected on each observed day, from one ODE solve."""
    start = [1 - 1 / POPULATION, 1 / POPULATION, 0.0]
    # rtol 1e-5: errors of ~1e-4 in a share, far below the test's binomial noise (~5e-3)
    solution = solve_ivp(
        _rates, (0.0, DAYS), start, t_eval=OBSERVED_DAYS, args=(beta, gamma), rtol=1e-5,
        atol=1e-8,
    )  # fmt: skip
    if not solution.success:  # a failed solve is the caller's to see, as a real model's would be
        raise RuntimeError(f"SIR solve failed at beta={beta}, gamma={gamma}: {solution.message}")
    return np.clip(solution.y[1], 0.0, 1.0)


def simulate(theta: torch.Tensor | np.ndarray) -> torch.Tensor:
    """x [n, 10] for θ [n, 2]: one ODE solve and one binomial test per row."""
    rows = np.asarray(theta, dtype=np.float64).reshape(-1, 2)
    x = np.empty((len(rows), len(OBSERVED_DAYS)), dtype=np.float32)
    for k, (beta, gamma) in enumerate(rows):
        x[k] = np.random.binomial(TESTED, infected(beta, gamma)) / TESTED
    return torch.from_numpy(x)
