"""The interface every SBI task implements, plus the pieces several tasks share.

Conventions (all tasks):
- ``theta`` is ``[n, dim_theta]`` and ``x`` is ``[n, dim_x]``; outputs land on the device and in
  the floating dtype of the input, so the same simulator runs on CPU or GPU.
- Randomness comes only from the ``torch.Generator`` passed in (it must live on the device that
  the output lands on), so a seed reproduces a data set exactly. ``None`` uses torch's global RNG.
- ``log_likelihood(theta, x)`` broadcasts: ``x`` may be one observation ``[dim_x]`` (or
  ``[1, dim_x]``) shared by every row of ``theta``, or one row per row of ``theta``.
"""

from __future__ import annotations

import math
import zlib
from abc import ABC, abstractmethod

import torch
from torch import Tensor

from trainforge.workloads.sbi import catalogue
from trainforge.workloads.sbi.catalogue import NUM_OBSERVATIONS  # sbibm's ten; so do we


def generator_device(generator: torch.Generator | None) -> torch.device:
    return generator.device if generator is not None else torch.device("cpu")


class Task(ABC):
    """A benchmark task: prior p(θ), simulator p(x | θ), numbered observations and likelihood."""

    name: str
    dim_theta: int
    dim_x: int
    num_observations: int = NUM_OBSERVATIONS
    revision: int = 1
    """Raised whenever a change makes the simulator give other x for the same seed: it is part
    of the simulation cache's key, so simulations made by an older definition are not reused."""

    def __init__(self) -> None:
        # Constants moved to a device/dtype once, not on every simulator call (a host-to-device
        # copy per call would serialise GPU simulation).
        self._constants: dict[tuple[str, torch.device, torch.dtype], Tensor] = {}

    # -- to implement -------------------------------------------------------------------------

    @abstractmethod
    def prior_sample(
        self, n: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32
    ) -> Tensor:
        """``n`` draws from the prior, ``[n, dim_theta]``, on the generator's device."""

    @abstractmethod
    def prior_log_prob(self, theta: Tensor) -> Tensor:
        """Normalised log prior density, ``[n]``; ``-inf`` outside the support."""

    @abstractmethod
    def prior_distribution(
        self, device: torch.device | str = "cpu"
    ) -> torch.distributions.Distribution:
        """The prior as a torch Distribution (what sbi's posteriors take as ``prior``), its
        parameters on ``device``: a posterior samples where its prior lives."""

    @abstractmethod
    def _simulate(self, theta: Tensor, generator: torch.Generator | None) -> Tensor:
        """``simulate`` after its argument checks."""

    @abstractmethod
    def _log_likelihood(self, theta: Tensor, x: Tensor) -> Tensor:
        """``log_likelihood`` after its argument checks (``x`` already broadcastable)."""

    # -- shared -------------------------------------------------------------------------------

    def simulate(self, theta: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """One simulation per row of ``theta``: ``[n, dim_theta]`` → ``[n, dim_x]``."""
        return self._simulate(self._check_theta(theta), generator)

    def log_likelihood(self, theta: Tensor, x_obs: Tensor) -> Tensor:
        """log p(x_obs | θ) per row of ``theta``, ``[n]`` (see the module docstring on shapes)."""
        theta = self._check_theta(theta)
        x = x_obs.to(device=theta.device, dtype=theta.dtype)
        if x.shape[-1] != self.dim_x or x.dim() > 2:
            raise ValueError(
                f"{self.name}: x must be [{self.dim_x}] or [n, {self.dim_x}], got {tuple(x.shape)}"
            )
        return self._log_likelihood(theta, x)

    def log_posterior_unnormalized(self, theta: Tensor, x_obs: Tensor) -> Tensor:
        """log p(θ) + log p(x_obs | θ); ``-inf`` outside the prior support (never NaN)."""
        log_prior = self.prior_log_prob(theta)
        inside = torch.isfinite(log_prior)
        # Outside the support the simulator's formulas may not even be defined.
        safe = torch.where(inside.unsqueeze(-1), theta, self._support_point(theta))
        value = log_prior + self.log_likelihood(safe, x_obs)
        return torch.where(inside & ~torch.isnan(value), value, -math.inf)

    def observation(self, num: int) -> tuple[Tensor, Tensor]:
        """(θ_true ``[dim_theta]``, x_obs ``[dim_x]``) of this project's own observation ``num``
        (1-based), on CPU (``workload.evaluation.observations_from: own``).

        Drawn by sbibm's protocol (θ from the prior, x simulated from it) with a fixed seed per
        task and number: deterministic across machines and available offline, but not sbibm's
        numbers. sbibm's stored observations, which its published scores use, are read from
        its wheel by ``trainforge.workloads.sbi.sbibm_data``.
        """
        if not isinstance(num, int) or not 1 <= num <= self.num_observations:
            raise ValueError(
                f"{self.name}: observation number must be 1..{self.num_observations}, got {num!r}"
            )
        generator = torch.Generator().manual_seed(zlib.crc32(f"{self.name}/{num}".encode()))
        theta = self.prior_sample(1, generator)
        x = self.simulate(theta, generator)
        return theta[0], x[0]

    def fingerprint(self) -> dict[str, object]:
        """What identifies the simulator's output in the simulation cache's key."""
        return catalogue.fingerprint(self.name, self.revision)

    def _check_theta(self, theta: Tensor) -> Tensor:
        if theta.dim() != 2 or theta.shape[1] != self.dim_theta:
            raise ValueError(
                f"{self.name}: theta must be [n, {self.dim_theta}], got {tuple(theta.shape)}"
            )
        if not theta.is_floating_point():
            raise TypeError(f"{self.name}: theta must be a floating tensor, got {theta.dtype}")
        return theta

    def _support_point(self, theta: Tensor) -> Tensor:
        """Any point inside the prior support, broadcastable to ``theta``."""
        return torch.zeros_like(theta[:1])

    def _constant(self, key: str, value: Tensor, like: Tensor) -> Tensor:
        slot = (key, like.device, like.dtype)
        if slot not in self._constants:
            self._constants[slot] = value.to(device=like.device, dtype=like.dtype)
        return self._constants[slot]

    def __repr__(self) -> str:
        return f"<task {self.name}: θ ∈ R^{self.dim_theta}, x ∈ R^{self.dim_x}>"


class BoxUniformPriorMixin:
    """Uniform prior on the box [low, high]^dim_theta (two_moons, gaussian_mixture, slcp)."""

    dim_theta: int
    low: float
    high: float

    def prior_sample(
        self, n: int, generator: torch.Generator | None = None, dtype: torch.dtype = torch.float32
    ) -> Tensor:
        u = torch.rand(
            n, self.dim_theta, generator=generator, device=generator_device(generator), dtype=dtype
        )
        return self.low + (self.high - self.low) * u

    def prior_log_prob(self, theta: Tensor) -> Tensor:
        inside = ((theta >= self.low) & (theta <= self.high)).all(dim=-1)
        log_density = -self.dim_theta * math.log(self.high - self.low)
        return torch.where(inside, log_density, -math.inf).to(theta.dtype)

    def prior_distribution(
        self, device: torch.device | str = "cpu"
    ) -> torch.distributions.Distribution:
        # the same construction as sbi's BoxUniform, without importing sbi here
        low = torch.full((self.dim_theta,), self.low, device=device)
        high = torch.full((self.dim_theta,), self.high, device=device)
        return torch.distributions.Independent(torch.distributions.Uniform(low, high), 1)

    def in_support(self, theta: Tensor) -> Tensor:
        return ((theta >= self.low) & (theta <= self.high)).all(dim=-1)


def gaussian_log_density(residual: Tensor, variance: float) -> Tensor:
    """Σ_i log N(r_i; 0, variance) over the last axis (isotropic Gaussian)."""
    d = residual.shape[-1]
    return -0.5 * (residual.square().sum(-1) / variance + d * math.log(2 * math.pi * variance))
