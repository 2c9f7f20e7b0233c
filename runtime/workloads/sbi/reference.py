"""This project's own reference posterior samplers for the benchmark tasks.

They score the posterior at this project's own observations (``observations_from: own``, no
download needed) and at any other x; at sbibm's stored observations the evaluation uses sbibm's
stored reference samples instead, and ``bench/sbibm_reference_check.py`` checks that these
samplers agree with those (C2ST ≤ 0.52 at each of the ten observations of each task).

Exact and i.i.d. where the posterior allows it:
- gaussian_linear: the conjugate Gaussian posterior.
- gaussian_mixture: the likelihood, read as a function of θ, is the same two-component mixture
  centred on x; the posterior is that mixture cut to the prior box, so rejection against the
  box is exact.
- two_moons: x = noise + g(θ) with g a rotation folded onto a half plane (|det| = 1 on each of its
  two branches), so θ = g⁻¹(x - noise) on a random branch, kept when inside the prior box, is an
  exact posterior draw (sbibm draws its reference the same way).

Everything else (slcp, bernoulli_glm, and any task with a tractable ``log_likelihood``) uses
``mcmc_samples``, sampling-importance-resampling followed by MCMC, repeated along a tempering
path (a sequential Monte Carlo sampler, Del Moral et al. 2006): a population of chains starts as
prior draws; each stage raises the likelihood's exponent β as far as keeps half the
population's effective sample size, resamples by those weights, and moves every chain with
vectorised random-walk Metropolis steps targeting prior × likelihood^β. At β = 1 the chains run
on to forget their shared ancestors and each contributes its final state.

The Metropolis steps are differential-evolution moves (ter Braak 2006): a chain proposes
θ + γ(θ_b − θ_c) + ε with b, c two chains of the *other* half of the population, so the proposal
adapts to the posterior's scale, correlations and modes while each half-update stays an exact
Metropolis step given the other half. Plain multi-chain MCMC from over-dispersed starts was
not enough here: on slcp's harder observations 1000 steps left quantiles up to 1 sd away from a
5000-step run. slcp's four modes are mirror images (θ3 → −θ3, θ4 → −θ4 leave prior and
likelihood unchanged), so its samples finally get random signs there, which makes the mode
weights exact whatever the chains' mixing between modes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from trainforge.workloads.sbi.tasks import GaussianLinear, GaussianMixture, Task, TwoMoons, get_task

DTYPE = torch.float64  # references are computed in float64 and returned in float32

# Rejection samplers give up below this acceptance rate rather than loop for minutes.
MIN_ACCEPTANCE = 1e-4
# Chains beyond this many would cost memory without making samples more independent.
MAX_CHAINS = 20_000
# A stage may halve the effective sample size at most; the tasks here need 3-10 stages.
MAX_STAGES = 1000


def reference_samples(task: Task | str, observation_num: int, n: int, seed: int) -> Tensor:
    """``n`` posterior samples (float32, CPU, ``[n, dim_theta]``) at this project's own
    observation ``observation_num`` (``Task.observation``)."""
    task = get_task(task) if isinstance(task, str) else task
    _, x_obs = task.observation(observation_num)
    return posterior_samples(task, x_obs, n, seed)


def posterior_samples(task: Task | str, x_obs: Tensor, n: int, seed: int) -> Tensor:
    """``n`` posterior samples (float32, CPU, ``[n, dim_theta]``) at any observation ``x_obs``
    ``[dim_x]`` (sbibm's stored ones, for instance: ``bench/sbibm_reference_check.py`` compares
    these samplers with sbibm's reference samples there)."""
    task = get_task(task) if isinstance(task, str) else task
    x_obs = x_obs.reshape(-1).cpu()
    generator = torch.Generator().manual_seed(seed)
    sampler = EXACT_SAMPLERS.get(task.name)
    if sampler is not None:
        samples = sampler(task, x_obs.to(DTYPE), n, generator)
    else:
        samples = mcmc_samples(task, x_obs, n, generator)
        if task.name == "slcp":
            samples = _random_signs(samples, columns=(2, 3), generator=generator)
    return samples.to(torch.float32)


# -- exact samplers ----------------------------------------------------------------------------


def _gaussian_linear(task: Task, x_obs: Tensor, n: int, generator: torch.Generator) -> Tensor:
    assert isinstance(task, GaussianLinear)
    mean, variance = task.posterior_mean_variance(x_obs)
    z = torch.randn(n, task.dim_theta, generator=generator, dtype=DTYPE)
    return mean + math.sqrt(variance) * z


def _gaussian_mixture(task: Task, x_obs: Tensor, n: int, generator: torch.Generator) -> Tensor:
    assert isinstance(task, GaussianMixture)

    def propose(m: int) -> Tensor:
        return x_obs + task.component_noise(m, generator, torch.device("cpu"), DTYPE)

    return _rejection(propose, task.in_support, n)


def _two_moons(task: Task, x_obs: Tensor, n: int, generator: torch.Generator) -> Tensor:
    assert isinstance(task, TwoMoons)

    def propose(m: int) -> Tensor:
        v = x_obs - task.noise(m, generator, torch.device("cpu"), DTYPE)
        branch = torch.randint(0, 2, (m,), generator=generator, dtype=DTYPE) * 2 - 1
        theta = task.unshift(v, branch)
        # g(θ)'s first coordinate is never positive: such noise draws have no preimage.
        return torch.where((v[:, :1] <= 0), theta, math.inf)

    return _rejection(propose, task.in_support, n)


EXACT_SAMPLERS: dict[str, Callable[[Task, Tensor, int, torch.Generator], Tensor]] = {
    "gaussian_linear": _gaussian_linear,
    "gaussian_mixture": _gaussian_mixture,
    "two_moons": _two_moons,
}


def _rejection(
    propose: Callable[[int], Tensor], accept: Callable[[Tensor], Tensor], n: int
) -> Tensor:
    kept: list[Tensor] = []
    have = tried = 0
    batch = max(2 * n, 1000)
    while have < n:
        candidates = propose(batch)
        good = candidates[accept(candidates)]
        kept.append(good)
        have += len(good)
        tried += batch
        if have < MIN_ACCEPTANCE * tried:
            raise RuntimeError(f"rejection sampling accepts only {have} of {tried} proposals")
    return torch.cat(kept)[:n]


# -- MCMC --------------------------------------------------------------------------------------


def mcmc_samples(
    task: Task,
    x_obs: Tensor,
    n: int,
    generator: torch.Generator,
    *,
    num_chains: int | None = None,
    final_steps: int = 1000,
    thin: int = 20,
    max_stage_steps: int = 100,
) -> Tensor:
    """``n`` approximate posterior samples (float64, CPU) from the task's exact likelihood.

    ``num_chains`` chains are tempered from the prior to the posterior (at most
    ``max_stage_steps`` Metropolis steps per stage), run ``final_steps`` more steps at β = 1, and
    then each contributes its state every ``thin`` steps until ``n`` states are kept. By default
    there is one chain per sample (up to MAX_CHAINS): several correlated states of one chain form
    tight clusters that a C2ST classifier learns across its cross-validation folds (seen here:
    0.535 for 10 states per chain against 0.495 for one, gaussian_linear, n = 4000).
    """
    if num_chains is None:
        num_chains = min(MAX_CHAINS, max(4, n + n % 2))
    if num_chains < 4 or num_chains % 2:
        raise ValueError(f"num_chains must be even and >= 4, got {num_chains}")
    if final_steps < 1:
        raise ValueError(f"final_steps must be >= 1, got {final_steps}")
    x = x_obs.to(DTYPE)
    theta = task.prior_sample(num_chains, generator, DTYPE)
    beta = 0.0
    for _ in range(MAX_STAGES):
        if beta >= 1.0:
            break
        log_lik = _finite_or_minus_inf(task.log_likelihood(theta, x))
        if not torch.isfinite(log_lik).any():
            raise RuntimeError(f"{task.name}: no chain has a finite likelihood at β = {beta:.3g}")
        next_beta = _next_temperature(log_lik, beta)
        weights = torch.softmax((next_beta - beta) * log_lik, dim=0)
        theta = theta[_systematic_resample(weights, generator)]
        beta = next_beta
        theta = _move(task, x, theta, beta, generator, max_stage_steps)
    else:
        raise RuntimeError(f"{task.name}: tempering stalled at β = {beta:.3g}")

    def log_target(t: Tensor) -> Tensor:
        return task.log_posterior_unnormalized(t, x)

    log_p = log_target(theta)
    per_chain = math.ceil(n / num_chains)
    kept: list[Tensor] = []
    for step in range(final_steps + (per_chain - 1) * thin):
        theta, log_p, _ = _differential_evolution_step(theta, log_p, log_target, generator)
        if step >= final_steps - 1 and (step - final_steps + 1) % thin == 0:
            kept.append(theta)
    samples = torch.cat(kept)
    # A random subset, so that the surplus (per_chain * num_chains - n) is dropped evenly.
    return samples[torch.randperm(len(samples), generator=generator)[:n]]


def _finite_or_minus_inf(values: Tensor) -> Tensor:
    return torch.where(torch.isnan(values), -math.inf, values)


def _next_temperature(log_lik: Tensor, beta: float) -> float:
    """The largest β' ≤ 1 whose incremental weights ℓ^(β' - β) keep an effective sample size
    of half the population (bisection: the ESS falls as β' grows)."""

    def ess_fraction(b: float) -> float:
        w = torch.softmax((b - beta) * log_lik, dim=0)
        return float(1.0 / w.square().sum()) / len(log_lik)

    if ess_fraction(1.0) >= 0.5:
        return 1.0
    low, high = beta, 1.0
    for _ in range(50):
        mid = 0.5 * (low + high)
        low, high = (mid, high) if ess_fraction(mid) >= 0.5 else (low, mid)
    # Always advance, even if one chain dominates (then one more stage does the rest).
    return min(1.0, max(low, beta + 1e-6))


def _systematic_resample(weights: Tensor, generator: torch.Generator) -> Tensor:
    """Indices drawn in proportion to ``weights`` with one shared uniform (lower variance than
    independent draws)."""
    n = len(weights)
    u = (torch.rand(1, generator=generator, dtype=weights.dtype) + torch.arange(n)) / n
    return torch.searchsorted(weights.cumsum(0), u).clamp_max(n - 1)


def _move(
    task: Task,
    x: Tensor,
    theta: Tensor,
    beta: float,
    generator: torch.Generator,
    max_steps: int,
) -> Tensor:
    """Metropolis steps on prior × likelihood^β until 99% of the chains have moved at least
    once (resampling left many chains sharing a parent), at least 3 and at most ``max_steps``."""

    def log_target(t: Tensor) -> Tensor:
        log_prior = task.prior_log_prob(t)
        log_lik = task.log_posterior_unnormalized(t, x) - log_prior
        return torch.where(torch.isfinite(log_prior), log_prior + beta * log_lik, -math.inf)

    log_p = log_target(theta)
    moved = torch.zeros(len(theta), dtype=torch.bool)
    for step in range(max_steps):
        theta, log_p, accepted = _differential_evolution_step(theta, log_p, log_target, generator)
        moved |= accepted
        if step >= 2 and moved.double().mean() >= 0.99:
            break
    return theta


def _differential_evolution_step(
    theta: Tensor,
    log_p: Tensor,
    log_target: Callable[[Tensor], Tensor],
    generator: torch.Generator,
) -> tuple[Tensor, Tensor, Tensor]:
    """One Metropolis update of every chain: (new states, their log densities, accepted)."""
    num_chains, dim = theta.shape
    accepted_parts: list[Tensor] = []
    half = num_chains // 2
    # ter Braak's step size, near-optimal for Gaussian targets; every tenth proposal uses γ = 1,
    # which carries a chain from one mode to the matching point of another.
    gamma_local = 2.38 / math.sqrt(2 * dim)
    for lo, hi, other_lo, other_hi in ((0, half, half, num_chains), (half, num_chains, 0, half)):
        current, other = theta[lo:hi], theta[other_lo:other_hi]
        m, k = hi - lo, other_hi - other_lo
        b = torch.randint(0, k, (m,), generator=generator)
        c = (b + 1 + torch.randint(0, k - 1, (m,), generator=generator)) % k  # c ≠ b
        jump = torch.rand(m, generator=generator, dtype=theta.dtype) < 0.1
        gamma = torch.where(jump, 1.0, gamma_local).to(theta.dtype).unsqueeze(-1)
        # A little Gaussian noise keeps the chain irreducible; it depends on the other half
        # only, so the proposal stays symmetric given it.
        noise = (
            1e-3 * other.std(dim=0) * torch.randn(m, dim, generator=generator, dtype=theta.dtype)
        )
        proposal = current + gamma * (other[b] - other[c]) + noise
        log_p_proposal = log_target(proposal)
        u = torch.rand(m, generator=generator, dtype=theta.dtype)
        accept = torch.log(u) < log_p_proposal - log_p[lo:hi]
        accepted_parts.append(accept)
        theta = torch.cat(
            (theta[:lo], torch.where(accept.unsqueeze(-1), proposal, current), theta[hi:])
        )
        log_p = torch.cat(
            (log_p[:lo], torch.where(accept, log_p_proposal, log_p[lo:hi]), log_p[hi:])
        )
    return theta, log_p, torch.cat(accepted_parts)


def _random_signs(samples: Tensor, columns: tuple[int, ...], generator: torch.Generator) -> Tensor:
    """Flip each listed coordinate of each sample with probability 1/2 (an exact symmetry)."""
    signs = torch.randint(0, 2, (len(samples), len(columns)), generator=generator) * 2 - 1
    out = samples.clone()
    out[:, list(columns)] *= signs.to(samples.dtype)
    return out
