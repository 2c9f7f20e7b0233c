"""Neural likelihood estimation (``workload.method: nle``): the estimator is sbi's likelihood
estimator q(x | θ) — x its input, θ its condition, both z-scored from the data given to the
builder — its loss is sbi's −log q(x | θ), it is rebuilt from its record and weights, and the
export loads as sbi's MCMCPosterior with the recipe's MCMC settings, whose potential is
log q(x_o | θ) + log p(θ)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.unit.sbi_helpers import _data
from trainforge.workloads.sbi import estimator as estimators
from trainforge.workloads.sbi import export, methods
from trainforge.workloads.sbi.config import EstimatorSection, SBIWorkloadConfig
from trainforge.workloads.sbi.tasks import get_task


def _record(model: str = "maf", dim_theta: int = 2, dim_x: int = 2) -> estimators.BuildRecord:
    section = EstimatorSection(model=model, hidden_features=16, num_transforms=2)
    return estimators.BuildRecord.from_config(section, dim_theta, dim_x, method="nle")


def test_nle_models_x_given_theta_and_its_loss_is_minus_log_q_of_x() -> None:
    theta, x = torch.randn(300, 3), torch.randn(300, 5)  # dimensions told apart
    built = estimators.build(_record(dim_theta=3, dim_x=5), theta, x)
    assert (tuple(built.input_shape), tuple(built.condition_shape)) == ((5,), (3,))
    loss = estimators.EstimatorLoss(built, "nle")(theta[:40], x[:40])
    assert loss.shape == (40,)
    log_q = built.log_prob(x[:40].unsqueeze(0), condition=theta[:40]).squeeze(0)
    torch.testing.assert_close(loss, -log_q)
    loss.mean().backward()
    assert all(p.grad is not None for p in built.parameters() if p.requires_grad)
    assert methods.get("nle").arrange("θ", "x") == ("x", "θ")
    assert methods.get("npe").arrange("θ", "x") == ("θ", "x")


def test_nle_z_scores_x_and_theta_from_the_data_given_to_the_builder() -> None:
    theta, x = _data()
    record = _record()
    losses = []
    for scaled_theta, scaled_x in ((theta, x), (theta, x * 10 + 3), (theta * 10 + 3, x)):
        torch.manual_seed(0)
        built = estimators.build(record, scaled_theta, scaled_x)
        losses.append(estimators.EstimatorLoss(built, "nle")(theta[:20], x[:20]))
    assert not torch.allclose(losses[0], losses[1])  # x (the input) z-scored
    assert not torch.allclose(losses[0], losses[2])  # θ (the condition) z-scored


@pytest.mark.parametrize("model", ["maf", "zuko_nsf"])
def test_an_nle_estimator_is_rebuilt_from_its_record_and_weights(model: str) -> None:
    theta, x = _data()
    record = _record(model)
    built = estimators.build(record, theta * 3 + 1, x - 2)
    again = estimators.rebuild(estimators.BuildRecord(**record.to_dict()), built.state_dict())
    assert again.input_shape == built.input_shape  # a likelihood estimator again
    torch.testing.assert_close(
        estimators.EstimatorLoss(built.eval(), "nle")(theta[:50], x[:50]),
        estimators.EstimatorLoss(again.eval(), "nle")(theta[:50], x[:50]),
    )


def test_a_few_hundred_steps_lower_the_nle_loss() -> None:
    theta, x = _data()
    torch.manual_seed(0)
    model = estimators.EstimatorLoss(estimators.build(_record(), theta, x), "nle")
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    with torch.no_grad():
        before = model(theta[1800:], x[1800:]).mean().item()
    for step in range(300):
        rows = torch.randint(0, 1800, (64,), generator=torch.Generator().manual_seed(step))
        optimizer.zero_grad()
        model(theta[rows], x[rows]).mean().backward()
        optimizer.step()
    with torch.no_grad():
        after = model(theta[1800:], x[1800:]).mean().item()
    assert after < before - 1.0, (before, after)


def test_the_nle_export_loads_as_sbis_mcmc_posterior_with_the_recipes_settings(
    tmp_path: Path,
) -> None:
    from sbi.inference import MCMCPosterior

    theta, x = _data()
    record = _record()
    estimator = estimators.build(record, theta, x).eval()
    cfg = SBIWorkloadConfig(method="nle")
    cfg.posterior.num_chains, cfg.posterior.warmup_steps = 4, 10
    path = tmp_path / "posterior.pt"
    export.save_posterior(path, estimator, record, {"task": "two_moons"}, export.sampling_of(cfg))
    bundle = torch.load(path, weights_only=True)
    assert bundle["build"]["method"] == "nle"
    assert bundle["sampling"] == {"mcmc_method": "slice_np_vectorized", "num_chains": 4,
                                  "warmup_steps": 10, "thin": 1}  # fmt: skip
    posterior = export.load_posterior(path)
    assert isinstance(posterior, MCMCPosterior)
    assert (posterior.method, posterior.num_chains, posterior.warmup_steps, posterior.thin) == (
        "slice_np_vectorized", 4, 10, 1)  # fmt: skip
    x_obs = x[0]
    torch.manual_seed(0)
    samples = posterior.sample((40,), x=x_obs, show_progress_bars=False)
    assert samples.shape == (40, 2) and bool(samples.abs().le(1).all())  # the prior's box
    prior = get_task("two_moons").prior_distribution()
    expected = estimator.log_prob(x_obs.reshape(1, 1, -1), condition=samples).squeeze(0)
    torch.testing.assert_close(
        posterior.potential(samples, x=x_obs), expected + prior.log_prob(samples),
        rtol=1e-4, atol=1e-4,
    )  # fmt: skip


def test_an_npe_file_without_a_method_still_loads_as_a_direct_posterior(tmp_path: Path) -> None:
    from sbi.inference import DirectPosterior

    theta, x = _data()
    record = estimators.BuildRecord.from_config(EstimatorSection(num_transforms=2), 2, 2)
    path = tmp_path / "posterior.pt"
    export.save_posterior(path, estimators.build(record, theta, x), record, {"task": "two_moons"})
    bundle = torch.load(path, weights_only=True)
    del bundle["build"]["method"], bundle["sampling"]  # as files without them are written
    torch.save(bundle, path)
    assert isinstance(export.load_posterior(path), DirectPosterior)
