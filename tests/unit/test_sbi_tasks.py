"""SBI benchmark tasks and their reference posteriors: definitions, likelihoods, samplers.

Sample sizes are small on purpose (the whole file runs in well under a minute on one core);
tolerances are several standard errors wide so the tests are deterministic in practice (they
are seeded anyway).
"""

from __future__ import annotations

import math

import pytest
import torch

from trainforge.errors import RecipeError
from trainforge.workloads.sbi.reference import mcmc_samples, reference_samples
from trainforge.workloads.sbi.tasks import TASKS, Task, UnknownTaskError, get_task
from trainforge.workloads.sbi.tasks.bernoulli_glm import design_matrix, prior_precision

DIMS = {
    "two_moons": (2, 2),
    "gaussian_linear": (10, 10),
    "gaussian_mixture": (2, 2),
    "slcp": (5, 8),
    "bernoulli_glm": (10, 10),
}
BOXES = {"two_moons": 1.0, "gaussian_mixture": 10.0, "slcp": 3.0}


def gen(seed: int, device: str = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


@pytest.fixture(params=sorted(TASKS))
def task(request: pytest.FixtureRequest) -> Task:
    return get_task(request.param)


# -- registry and interface ---------------------------------------------------------------------


def test_registry_holds_the_five_sbibm_tasks() -> None:
    assert set(TASKS) == set(DIMS)
    for name, (dim_theta, dim_x) in DIMS.items():
        task = get_task(name)
        assert (task.name, task.dim_theta, task.dim_x) == (name, dim_theta, dim_x)


def test_unknown_task_names_the_known_ones() -> None:
    with pytest.raises(UnknownTaskError) as info:
        get_task("two_moon")
    message = str(info.value)
    assert "did you mean 'two_moons'" in message
    assert all(name in message for name in TASKS)
    assert isinstance(info.value, RecipeError)  # the CLI turns it into exit status 2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_shapes_dtypes_and_finite_values(task: Task, dtype: torch.dtype) -> None:
    theta = task.prior_sample(256, gen(0), dtype=dtype)
    x = task.simulate(theta, gen(1))
    assert theta.shape == (256, task.dim_theta) and theta.dtype == dtype
    assert x.shape == (256, task.dim_x) and x.dtype == dtype
    assert torch.isfinite(x).all()
    assert torch.isfinite(task.prior_log_prob(theta)).all()
    log_lik = task.log_likelihood(theta, x)
    assert log_lik.shape == (256,) and log_lik.dtype == dtype and torch.isfinite(log_lik).all()


def test_same_seed_same_draws_other_seed_other_draws(task: Task) -> None:
    theta = task.prior_sample(64, gen(3))
    assert torch.equal(theta, task.prior_sample(64, gen(3)))
    assert not torch.equal(theta, task.prior_sample(64, gen(4)))
    x = task.simulate(theta, gen(5))
    assert torch.equal(x, task.simulate(theta, gen(5)))
    assert not torch.equal(x, task.simulate(theta, gen(6)))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_outputs_stay_on_the_input_device(task: Task, device: str) -> None:
    theta = task.prior_sample(20_000, gen(0, device))
    x = task.simulate(theta, gen(1, device))
    assert theta.device.type == device and x.device.type == device
    assert task.log_likelihood(theta, x).device.type == device
    assert task.prior_log_prob(theta).device.type == device
    # The same distribution wherever it runs (different RNG streams, so compare moments).
    theta_cpu = task.prior_sample(20_000, gen(0))
    x_cpu = task.simulate(theta_cpu, gen(1))
    scale = x_cpu.std(0) + 1e-6
    assert ((x.cpu().mean(0) - x_cpu.mean(0)).abs() / scale).max() < 0.05


def test_prior_samples_lie_in_the_support(task: Task) -> None:
    theta = task.prior_sample(5000, gen(0))
    assert torch.isfinite(task.prior_log_prob(theta)).all()
    if task.name in BOXES:
        bound = BOXES[task.name]
        assert theta.abs().max() <= bound
        assert theta.abs().max() > 0.95 * bound  # fills the box, not a corner of it
        outside = torch.full((1, task.dim_theta), 1.01 * bound)
        assert task.prior_log_prob(outside).item() == -math.inf
        volume = (2 * bound) ** task.dim_theta
        assert task.prior_log_prob(theta[:1]).item() == pytest.approx(-math.log(volume))


def test_gaussian_priors_match_their_definition() -> None:
    linear = get_task("gaussian_linear")
    theta = linear.prior_sample(50_000, gen(0), dtype=torch.float64)
    assert theta.var(0).mean().item() == pytest.approx(0.1, rel=0.02)
    glm = get_task("bernoulli_glm")
    precision = prior_precision()
    theta = glm.prior_sample(100_000, gen(0), dtype=torch.float64)
    cov = torch.linalg.inv(precision)
    assert torch.allclose(torch.cov(theta.T), cov, atol=0.03 * cov.diag().max().item())
    reference = torch.distributions.MultivariateNormal(torch.zeros(10), precision_matrix=precision)
    assert torch.allclose(glm.prior_log_prob(theta[:50]), reference.log_prob(theta[:50]))


def test_observations_are_seeded_and_numbered(task: Task) -> None:
    theta, x = task.observation(1)
    assert theta.shape == (task.dim_theta,) and x.shape == (task.dim_x,)
    again = task.observation(1)
    assert torch.equal(theta, again[0]) and torch.equal(x, again[1])
    assert not torch.equal(x, task.observation(2)[1])
    assert torch.isfinite(task.prior_log_prob(theta.unsqueeze(0))).all()
    for bad in (0, 11):
        with pytest.raises(ValueError, match=r"1\.\.10"):
            task.observation(bad)


def test_log_likelihood_broadcasts_one_observation(task: Task) -> None:
    theta = task.prior_sample(8, gen(0))
    _, x = task.observation(3)
    one = task.log_likelihood(theta, x)
    assert torch.allclose(one, task.log_likelihood(theta, x.unsqueeze(0)))
    assert torch.allclose(one, task.log_likelihood(theta, x.expand(8, -1)))
    with pytest.raises(ValueError, match="theta must be"):
        task.simulate(theta[:, :1])


def test_likelihood_ratios_average_to_one(task: Task) -> None:
    """E_{x ~ p(x|θ0)}[p(x|θ1) / p(x|θ0)] = 1: an empirical check of log_likelihood that holds
    even where it is exact only up to a θ-free constant (bernoulli_glm)."""
    theta0 = task.observation(4)[0].double().unsqueeze(0)
    theta1 = theta0 + 0.01 * torch.linspace(-1, 1, task.dim_theta, dtype=torch.float64)
    x = task.simulate(theta0.expand(100_000, -1), gen(0))
    ratio = torch.exp(task.log_likelihood(theta1, x) - task.log_likelihood(theta0, x))
    standard_error = (ratio.std() / math.sqrt(len(ratio))).item()
    assert abs(ratio.mean().item() - 1.0) < max(5 * standard_error, 1e-3)


# -- gaussian_linear ----------------------------------------------------------------------------


def test_gaussian_linear_likelihood_and_reference_are_analytic() -> None:
    task = get_task("gaussian_linear")
    theta = task.prior_sample(16, gen(0), dtype=torch.float64)
    _, x = task.observation(1)
    x = x.double()
    noise = torch.distributions.MultivariateNormal(theta, 0.1 * torch.eye(10, dtype=torch.float64))
    assert torch.allclose(task.log_likelihood(theta, x), noise.log_prob(x))

    samples = reference_samples(task, 1, 40_000, seed=0)
    assert samples.shape == (40_000, 10) and samples.dtype == torch.float32
    samples = samples.double()
    mean, variance = 0.5 * x, 0.05  # precisions add: 1/0.1 + 1/0.1
    assert (samples.mean(0) - mean).abs().max() < 5 * math.sqrt(variance / 40_000)
    assert torch.allclose(
        torch.cov(samples.T), variance * torch.eye(10, dtype=torch.float64), atol=0.004
    )


def test_mcmc_sampler_recovers_the_gaussian_linear_posterior() -> None:
    """The generic sampler (used for slcp and bernoulli_glm) against an analytic answer."""
    task = get_task("gaussian_linear")
    _, x = task.observation(2)
    mean, variance = task.posterior_mean_variance(x.double())
    samples = mcmc_samples(task, x, 3000, gen(0), final_steps=300)
    assert samples.shape == (3000, 10) and samples.dtype == torch.float64
    z = (samples - mean) / math.sqrt(variance)
    assert z.mean(0).abs().max() < 0.1
    assert torch.allclose(z.var(0), torch.ones(10, dtype=torch.float64), atol=0.1)
    assert (torch.cov(z.T) - torch.eye(10, dtype=torch.float64)).abs().max() < 0.1


# -- gaussian_mixture ---------------------------------------------------------------------------


def test_gaussian_mixture_reference_is_the_truncated_mixture() -> None:
    task = get_task("gaussian_mixture")
    _, x = task.observation(1)
    samples = reference_samples(task, 1, 20_000, seed=0)
    assert samples.abs().max() <= 10.0
    distance = (samples - x).norm(dim=-1)
    # Half the mass within 0.3 of x (narrow component, σ = 0.1), plus ~4% of the wide one.
    wide_inside = 1 - math.exp(-(0.3**2) / 2)
    expected = 0.5 * (1 - math.exp(-4.5)) + 0.5 * wide_inside
    assert (distance < 0.3).double().mean().item() == pytest.approx(expected, abs=0.03)
    theta = torch.tensor([[1.0, -2.0]], dtype=torch.float64)
    point = torch.tensor([1.5, -2.0], dtype=torch.float64)
    by_hand = math.log(
        0.5 * math.exp(-0.125) / (2 * math.pi) + 0.5 * math.exp(-12.5) / (0.02 * math.pi)
    )
    assert task.log_likelihood(theta, point).item() == pytest.approx(by_hand)


# -- two_moons ----------------------------------------------------------------------------------


def test_two_moons_likelihood_is_a_normalised_density() -> None:
    task = get_task("two_moons")
    theta = torch.tensor([[0.3, -0.6]], dtype=torch.float64)
    centre = task.shift(theta)[0] + torch.tensor([0.25, 0.0], dtype=torch.float64)
    step = 0.0008
    # Cell centres: the density has an (integrable) 1/|u| singularity at the moon's centre.
    axis = torch.arange(-0.16, 0.16, step, dtype=torch.float64) + step / 2
    grid = torch.cartesian_prod(axis + centre[0], axis + centre[1])
    density = task.log_likelihood(theta, grid).exp()
    assert (density.sum() * step * step).item() == pytest.approx(1.0, abs=0.01)
    # An empirical check of the same density: mass of a small square on the crescent.
    x = task.simulate(theta.expand(400_000, -1), gen(0))
    corner = centre + torch.tensor([0.09, 0.0], dtype=torch.float64)
    inside = ((x >= corner) & (x < corner + 0.02)).all(-1).double().mean().item()
    mask = ((grid >= corner) & (grid < corner + 0.02)).all(-1)
    predicted = (density[mask].sum() * step * step).item()
    assert inside == pytest.approx(predicted, rel=0.05)


def test_two_moons_reference_has_two_crescents_around_x_obs() -> None:
    task = get_task("two_moons")
    _, x = task.observation(1)
    samples = reference_samples(task, 1, 5000, seed=0)
    assert samples.abs().max() <= 1.0
    # The two crescents are mirror images across θ1 + θ2 = 0, separated by a gap there.
    fold = (samples[:, 0] + samples[:, 1]) / math.sqrt(2)
    assert 0.4 < (fold > 0).double().mean().item() < 0.6
    assert fold.abs().min() > 0.1
    # Posterior predictive: x_obs - noise + noise' stays within a moon's diameter of x_obs.
    distance = (task.simulate(samples, gen(1)) - x).norm(dim=-1)
    assert distance.max() < 0.3 and distance.median() < 0.15
    prior_distance = (task.simulate(task.prior_sample(5000, gen(2)), gen(3)) - x).norm(dim=-1)
    assert prior_distance.median() > 3 * distance.median()


def test_mcmc_on_two_moons_agrees_with_the_exact_reference() -> None:
    """Checks the change-of-variables likelihood: MCMC on it must match exact inversion."""
    task = get_task("two_moons")
    _, x = task.observation(2)
    exact = reference_samples(task, 2, 3000, seed=0).double()
    mcmc = mcmc_samples(task, x, 3000, gen(1), final_steps=300)
    # Mode weights first, then quantiles away from the median (which jumps between the two
    # crescents when their weights are near 1/2).
    fold_exact = (exact.sum(-1) > 0).double().mean()
    assert (fold_exact - (mcmc.sum(-1) > 0).double().mean()).abs() < 0.05
    probes = torch.tensor([0.05, 0.25, 0.75, 0.95], dtype=torch.float64)
    assert exact.shape == mcmc.shape == (3000, 2)
    for direction in ([1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [1.0, -1.0]):
        d = torch.tensor(direction, dtype=torch.float64)
        q_exact = torch.quantile(exact @ d, probes)
        q_mcmc = torch.quantile(mcmc @ d, probes)
        assert (q_exact - q_mcmc).abs().max() < 0.05


# -- slcp -----------------------------------------------------------------------------------------


def test_slcp_likelihood_matches_torch_gaussians() -> None:
    task = get_task("slcp")
    theta = task.prior_sample(32, gen(0), dtype=torch.float64)
    x = task.simulate(theta, gen(1))
    s1, s2, rho = theta[:, 2] ** 2, theta[:, 3] ** 2, torch.tanh(theta[:, 4])
    cov = torch.stack(
        (
            torch.stack((s1**2 + 1e-6, rho * s1 * s2), -1),
            torch.stack((rho * s1 * s2, s2**2 + 1e-6), -1),
        ),
        -2,
    )
    gaussian = torch.distributions.MultivariateNormal(theta[:, :2].unsqueeze(1), cov.unsqueeze(1))
    expected = gaussian.log_prob(x.reshape(32, 4, 2)).sum(-1)
    assert torch.allclose(task.log_likelihood(theta, x), expected, rtol=1e-6, atol=1e-6)


def test_slcp_reference_is_symmetric_and_predicts_x_obs() -> None:
    task = get_task("slcp")
    _, x = task.observation(1)
    samples = reference_samples(task, 1, 2000, seed=0)
    assert samples.shape == (2000, 5) and samples.dtype == torch.float32
    assert samples.abs().max() <= 3.0
    for column in (2, 3):  # four mirror-image modes: θ3 and θ4 enter only squared
        assert 0.4 < (samples[:, column] > 0).double().mean().item() < 0.6

    # Posterior predictive check on the statistics the posterior is about: the four draws'
    # mean and spread per coordinate. x_obs must look typical under the posterior predictive
    # and its spreads must sit much closer to x_obs's than the prior predictive's.
    def summary(x: torch.Tensor) -> torch.Tensor:
        pairs = x.reshape(-1, 4, 2)
        return torch.cat((pairs.mean(1), pairs.std(1).log()), dim=-1)

    observed = summary(x.unsqueeze(0))
    predicted = summary(task.simulate(samples, gen(1)))
    from_prior = summary(task.simulate(task.prior_sample(2000, gen(2)), gen(3)))
    rank = (predicted < observed).double().mean(0)
    assert ((rank > 0.01) & (rank < 0.99)).all()
    near = (predicted - observed).abs().median(0).values
    far = (from_prior - observed).abs().median(0).values
    # Only the spreads: with four draws the means stay uncertain when x_obs is very spread out.
    assert (near[2:] < 0.5 * far[2:]).all()


# -- bernoulli_glm --------------------------------------------------------------------------------


def test_bernoulli_glm_design_and_sufficient_statistics() -> None:
    task = get_task("bernoulli_glm")
    v = design_matrix()
    assert v.shape == (100, 10) and torch.equal(v[:, 0], torch.ones(100, dtype=torch.float64))
    assert torch.equal(v[1:, 2], v[:-1, 1]) and v[0, 2] == 0  # column j is the stimulus lagged j-1
    assert torch.equal(v, task.design)  # fixed by its seed
    # θ = 0: every spike train has probability 2^-100, whatever its statistics.
    theta = torch.zeros(1, 10, dtype=torch.float64)
    _, x = task.observation(1)
    assert task.log_likelihood(theta, x).item() == pytest.approx(-100 * math.log(2))
    # E[x] = Vᵀσ(Vθ): the score of the likelihood has mean zero.
    theta = task.observation(2)[0].double().unsqueeze(0)
    sims = task.simulate(theta.expand(50_000, -1), gen(0))
    expected = v.T @ torch.sigmoid(v @ theta[0])
    standard_error = sims.std(0) / math.sqrt(50_000)
    assert ((sims.mean(0) - expected).abs() < 5 * standard_error + 1e-9).all()
    assert torch.equal(sims[:, 0], sims[:, 0].round())  # spike counts are integers


def test_bernoulli_glm_reference_predicts_x_obs() -> None:
    task = get_task("bernoulli_glm")
    _, x = task.observation(1)
    samples = reference_samples(task, 1, 2000, seed=0)
    assert samples.shape == (2000, 10) and torch.isfinite(samples).all()
    predicted = task.simulate(samples, gen(1))
    rank = (predicted < x).double().mean(0) + 0.5 * (predicted == x).double().mean(0)
    assert ((rank > 0.01) & (rank < 0.99)).all()
    from_prior = task.simulate(task.prior_sample(2000, gen(2)), gen(3))
    assert (predicted - x).norm(dim=-1).median() < 0.5 * (from_prior - x).norm(dim=-1).median()


def test_reference_samples_are_seeded() -> None:
    for name in ("two_moons", "gaussian_linear"):
        a = reference_samples(name, 1, 500, seed=0)
        assert a.dtype == torch.float32 and a.device.type == "cpu"
        assert torch.equal(a, reference_samples(name, 1, 500, seed=0))
        assert not torch.equal(a, reference_samples(name, 1, 500, seed=1))
    task = get_task("slcp")
    _, x = task.observation(1)
    a = mcmc_samples(task, x, 100, gen(0), final_steps=20)
    assert torch.equal(a, mcmc_samples(task, x, 100, gen(0), final_steps=20))
