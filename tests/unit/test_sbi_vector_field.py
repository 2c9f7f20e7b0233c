"""The vector-field methods (``workload.method: fmpe | npse``): the estimator is sbi's
flow-matching or score estimator of θ given x (sbi's mlp unless the recipe names another of its
nets, an embedding net on x allowed), trained through its own ``loss(θ, condition=x)`` and
validated at sbi's fixed times; a few hundred steps lower that loss; the export loads as sbi's
VectorFieldPosterior (ODE for fmpe, SDE for npse) rebuilt from its record, whose samples lie in
the prior's box; a density flow's name or a misspelt setting is refused in one line before
anything starts, and npse's evaluation skips SBC in one line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.unit.sbi_helpers import DEBUG, _data, assert_refused_before_launch
from trainforge import config
from trainforge.workloads.sbi import estimator as estimators
from trainforge.workloads.sbi import evaluate, export
from trainforge.workloads.sbi.config import EstimatorSection, EvaluationSection
from trainforge.workloads.sbi.methods import vector_field

METHODS = ("fmpe", "npse")
CLASSES = {"fmpe": "FlowMatchingEstimator", "npse": "VEScoreEstimator"}
SAMPLERS = {"fmpe": "ode", "npse": "sde"}


def _record(method: str, model: str | None = None, **kwargs: object) -> estimators.BuildRecord:
    section = EstimatorSection(model=model, hidden_features=32, model_kwargs=dict(kwargs))
    return estimators.BuildRecord.from_config(section, 2, 2, method=method)


def _recipe(method: str) -> Path:
    return DEBUG.with_name(f"two_moons_{method}_debug.yaml")


@pytest.mark.parametrize("method", METHODS)
def test_the_estimator_is_sbis_vector_field_of_theta_given_x_with_one_loss_per_row(
    method: str,
) -> None:
    theta, x = torch.randn(300, 3), torch.randn(300, 5)  # dimensions told apart
    section = EstimatorSection(hidden_features=32, num_transforms=7, num_bins=3)
    record = estimators.BuildRecord.from_config(section, 3, 5, method=method)
    assert record.model == "mlp"  # the method's default network
    built = estimators.build(record, theta, x)
    assert type(built).__name__ == CLASSES[method]
    assert (tuple(built.input_shape), tuple(built.condition_shape)) == ((3,), (5,))
    # the flows' keys shape no vector field: the same parameters without them
    plain = estimators.build(estimators.BuildRecord.from_config(
        EstimatorSection(hidden_features=32), 3, 5, method=method), theta, x)  # fmt: skip
    assert [p.shape for p in built.parameters()] == [p.shape for p in plain.parameters()]
    loss = estimators.EstimatorLoss(built, method)(theta[:40], x[:40])
    assert loss.shape == (40,) and bool(torch.isfinite(loss).all())
    loss.mean().backward()
    assert all(p.grad is not None for p in built.parameters() if p.requires_grad)


@pytest.mark.parametrize("method", METHODS)
def test_an_embedding_net_on_x_goes_to_sbis_builder(method: str) -> None:
    theta, x = _data(300)
    section = EstimatorSection(hidden_features=32, embedding="fully_connected",
                               embedding_features=6)  # fmt: skip
    built = estimators.build(estimators.BuildRecord.from_config(section, 2, 2, method=method),
                             theta, x)  # fmt: skip
    assert type(built._embedding_net[-1]).__name__ == "FCEmbedding"
    assert built._embedding_net(x[:4]).shape == (4, 6)
    loss = estimators.EstimatorLoss(built, method)(theta[:40], x[:40])
    loss.mean().backward()
    assert all(p.grad is not None for p in built._embedding_net.parameters())


@pytest.mark.parametrize("method", METHODS)
def test_validation_takes_the_loss_at_sbis_fixed_times(method: str) -> None:
    theta, x = _data(300)
    built = estimators.build(_record(method), theta, x)
    model = estimators.EstimatorLoss(built, method).eval()
    times = built.solve_schedule(10, t_min=built.t_min + 0.05, t_max=built.t_max - 0.05)
    with torch.no_grad():
        torch.manual_seed(3)
        validation = model(theta[:50], x[:50])
        torch.manual_seed(3)  # the same noise, at each of the ten times in turn
        at_times = built.loss(theta[:50].repeat(10, 1), condition=x[:50].repeat(10, 1),
                              times=times.repeat_interleave(50))  # fmt: skip
    assert validation.shape == (50,)
    torch.testing.assert_close(validation, at_times.reshape(10, 50).mean(dim=0))


@pytest.mark.parametrize(("method", "fall"), [("fmpe", 0.3), ("npse", 3.0)])
def test_a_few_hundred_steps_lower_the_validation_loss(method: str, fall: float) -> None:
    theta, x = _data()
    torch.manual_seed(0)
    model = estimators.EstimatorLoss(estimators.build(_record(method), theta[:1800], x[:1800]),
                                     method)  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=2e-3)

    def validation() -> float:
        model.eval()
        with torch.no_grad():
            return model(theta[1800:], x[1800:]).mean().item()

    before = validation()
    model.train()
    for step in range(300):
        rows = torch.randint(0, 1800, (128,), generator=torch.Generator().manual_seed(step))
        optimizer.zero_grad()
        model(theta[rows], x[rows]).mean().backward()
        optimizer.step()
    after = validation()
    # measured here: fmpe 1.02 to 0.29, npse 35.1 to 28.3
    assert after < before - fall, (before, after)


@pytest.mark.parametrize("method", METHODS)
def test_the_export_loads_as_sbis_vector_field_posterior_rebuilt_from_its_record(
    method: str, tmp_path: Path
) -> None:
    from sbi.inference import VectorFieldPosterior

    theta, x = _data(500)
    record = _record(method, num_layers=2)
    estimator = estimators.build(record, theta * 3 + 1, x - 2).eval()
    path = tmp_path / "posterior.pt"
    cfg = config.load(_recipe(method), []).workload
    export.save_posterior(path, estimator, record, {"task": "two_moons"}, export.sampling_of(cfg))
    bundle = torch.load(path, weights_only=True)
    assert (bundle["build"]["method"], bundle["build"]["model"]) == (method, "mlp")
    posterior = export.load_posterior(path)
    assert isinstance(posterior, VectorFieldPosterior)
    assert posterior.sample_with == SAMPLERS[method]
    rebuilt = posterior.vector_field_estimator
    assert type(rebuilt) is type(estimator) and rebuilt is not estimator
    with torch.no_grad():  # the same network: weights and z-scoring (from θ * 3 + 1)
        times = torch.full((20,), 0.5)
        torch.manual_seed(0)
        ours = estimator.loss(theta[:20], condition=x[:20], times=times)
        torch.manual_seed(0)
        torch.testing.assert_close(rebuilt.loss(theta[:20], condition=x[:20], times=times), ours)
    torch.manual_seed(0)
    samples = posterior.sample((50,), x=x[0], show_progress_bars=False)
    assert samples.shape == (50, 2) and bool(samples.abs().le(1).all())  # the prior's box


@pytest.mark.parametrize("method", METHODS)
def test_the_debug_recipes_train_sbis_mlp(method: str) -> None:
    cfg = config.load(_recipe(method), []).workload
    assert (cfg.method, cfg.estimator.model) == (method, "mlp")
    estimators.probe_estimator(estimators.BuildRecord.from_config(
        cfg.estimator, 2, 2, method=method))  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["workload.estimator.model=maf"], "workload.estimator.model: maf is a density "
         "estimator (a flow), and method fmpe learns the posterior q(θ | x) as a flow-matching"),
        (["workload.estimator.model=nsf", "workload.method=npse"],
         "workload.estimator.model: nsf is a density estimator (a flow), and method npse"),
        (["workload.estimator.model=ada_mlpp"], "workload.estimator.model: 'ada_mlpp' is not "
         "a known estimator (did you mean 'ada_mlp'?)"),
    ],
)  # fmt: skip
def test_a_density_flow_for_a_vector_field_is_one_line_and_exit_2_before_launch(
    overrides: list[str], message: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    assert_refused_before_launch(_recipe("fmpe"), overrides, message, monkeypatch, capsys)


def test_model_kwargs_are_the_vector_field_factories_own() -> None:
    estimators.probe_estimator(_record("npse", num_layers=2, sde_type="vp", sigma_max=5.0))
    estimators.probe_estimator(_record("fmpe", "ada_mlp", num_layers=2, t_embedding_dim=16))
    assert "sde_type" in vector_field.arguments(_factory("posterior_score_nn"))
    assert "sde_type" not in vector_field.arguments(_factory("posterior_flow_nn"))
    for method, setting in (("fmpe", "num_layerz"), ("fmpe", "sigma_max"), ("npse", "bins")):
        told = re.escape("sbi's posterior_") + ".*" + re.escape(f"takes no '{setting}'")
        with pytest.raises(estimators.BuilderError, match=told):
            estimators.probe_estimator(_record(method, **{setting: 2}))


def _factory(name: str) -> object:
    from sbi import neural_nets

    return getattr(neural_nets, name)


def test_sbc_runs_for_fmpe_and_npse_skips_it_in_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    asked = EvaluationSection(sbc_runs=50)
    assert evaluate.calibrates(asked, "fmpe") and capsys.readouterr().out == ""
    assert not evaluate.calibrates(asked, "npse")
    said = capsys.readouterr()
    line = (said.out + said.err).strip()
    assert line.count("\n") == 0 and "SBC and TARP skipped" in line, line
    assert "method npse's posterior integrates 500 SDE steps" in line, line
    assert not evaluate.calibrates(EvaluationSection(sbc_runs=0), "npse")
    said = capsys.readouterr()
    assert said.out + said.err == ""  # nothing asked, nothing said
