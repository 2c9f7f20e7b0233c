"""SBI workload parts without Ray: recipe checks, estimators built by sbi's builders and rebuilt
from their record, the posterior export loaded back as sbi's DirectPosterior, the data split,
user simulators by import path, early stopping and LR scaling."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest
import torch

from trainforge import config
from trainforge.config.schema import TrainSection
from trainforge.distributed import WorkerContext
from trainforge.early_stopping import EarlyStopping
from trainforge.errors import RecipeError
from trainforge.workloads.sbi import estimator as estimators
from trainforge.workloads.sbi import export, sources
from trainforge.workloads.sbi.config import EstimatorSection, SBIWorkloadConfig
from trainforge.workloads.sbi.tasks import TASKS, get_task
from trainforge.workloads.sbi.workload import split

ROOT = Path(__file__).resolve().parents[2]
DEBUG = ROOT / "recipes" / "sbi" / "two_moons_debug.yaml"
CPU = WorkerContext(0, 0, 1, 0, torch.device("cpu"))


def _data(n: int = 2000, task: str = "two_moons") -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    t = get_task(task)
    theta = t.prior_sample(n, generator)
    return theta, t.simulate(theta, generator)


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("workload.task=two_moon", "did you mean 'two_moons'"),
        ("precision.dtype=bf16", "precision.dtype: bf16 is not supported for workload.kind sbi"),
        ("workload.estimator.model=mafx", "workload.estimator.model: 'mafx' is not a known"),
        ("workload.estimator.embedding=rnn", "workload.estimator.embedding: 'rnn'"),
        ("workload.estimator.z_score_x=global", "workload.estimator.z_score_x: 'global'"),
        ("workload.evaluation.observations=[0,11]", "[0, 11] out of range"),
        ("workload.val_fraction=1.5", "workload.val_fraction: must be in (0, 1)"),
        ("workload.simulation.num_simulations=1", "num_simulations: must be >= 2"),
        ("workload.simulation.device=tpu", "workload.simulation.device: 'tpu'"),
        ("train.early_stopping_patience=-1", "train.early_stopping_patience: must be >= 0"),
        ("train.lr_scaling=cubic", "train.lr_scaling: 'cubic' is not one of"),
        ("precision.cuda_graphs=true train.grad_accum_steps=2", "needs train.grad_accum_steps=1"),
        ("precision.cuda_graphs=true train.optimizer=sgd", "needs train.optimizer adam or adamw"),
        ("workload.prior=a:b", "only used with task: custom"),
    ],
)
def test_bad_sbi_recipe_values_name_their_key(override: str, message: str) -> None:
    with pytest.raises(RecipeError, match=re.escape(message)):
        config.load(DEBUG, override.split())


def test_every_sbi_recipe_validates() -> None:
    recipes = sorted((ROOT / "recipes" / "sbi").glob("*.yaml"))
    assert len(recipes) >= 6
    for recipe in recipes:
        cfg = config.load(recipe)
        assert cfg.workload.kind == "sbi"


@pytest.mark.parametrize("budget", ["1e4", "1e5", "1e6"])
def test_one_recipe_per_budget_takes_any_task_and_names_the_run_after_it(budget: str) -> None:
    recipe = ROOT / "recipes" / "sbi" / f"npe_{budget}.yaml"
    assert config.load(recipe).run.name == f"two_moons_npe_{budget}"  # the default task
    for task in TASKS:
        cfg = config.load(recipe, [f"workload.task={task}"])
        assert (cfg.workload.task, cfg.run.name) == (task, f"{task}_npe_{budget}")


def test_lr_scaling() -> None:
    train = TrainSection(lr=1e-3, lr_reference_batch=256, lr_scaling="linear")
    assert config.scaled_lr(train, 1024) == pytest.approx(4e-3)
    train = dataclasses.replace(train, lr_scaling="sqrt")
    assert config.scaled_lr(train, 1024) == pytest.approx(2e-3)
    train = dataclasses.replace(train, lr_scaling="none")
    assert config.scaled_lr(train, 1024) == pytest.approx(1e-3)


@pytest.mark.parametrize("model", ["maf", "nsf", "mdn", "zuko_maf"])
def test_an_estimator_is_rebuilt_from_its_record_and_weights(model: str) -> None:
    theta, x = _data()
    record = estimators.BuildRecord.from_config(EstimatorSection(model=model), 2, 2)
    built = estimators.build(record, theta * 3 + 1, x - 2)  # z-scoring from these numbers
    rebuilt = estimators.rebuild(record, built.state_dict())
    loss = estimators.NPELoss(built.eval())
    again = estimators.NPELoss(rebuilt.eval())
    torch.testing.assert_close(loss(theta[:50], x[:50]), again(theta[:50], x[:50]))
    assert loss(theta[:50], x[:50]).shape == (50,)


def test_z_scoring_comes_from_the_data_given_to_the_builder() -> None:
    theta, x = _data()
    record = estimators.BuildRecord.from_config(EstimatorSection(), 2, 2)
    torch.manual_seed(0)
    a = estimators.build(record, theta, x)
    torch.manual_seed(0)
    b = estimators.build(record, theta * 10, x)
    assert not torch.allclose(
        estimators.NPELoss(a)(theta[:5], x[:5]), estimators.NPELoss(b)(theta[:5], x[:5])
    )


@pytest.mark.parametrize(
    ("embedding", "shape", "dim_x"),
    [("fully_connected", [], 6), ("cnn", [16, 16], 256), ("permutation_invariant", [5, 3], 15)],
)
def test_embedding_nets_build_and_train(embedding: str, shape: list[int], dim_x: int) -> None:
    cfg = EstimatorSection(embedding=embedding, embedding_input_shape=shape)  # type: ignore[arg-type]
    estimators.check(cfg)
    record = estimators.BuildRecord.from_config(cfg, 2, dim_x)
    theta, x = torch.randn(64, 2), torch.randn(64, dim_x)
    model = estimators.NPELoss(estimators.build(record, theta, x))
    loss = model(theta, x).mean()
    loss.backward()
    assert torch.isfinite(loss)
    rebuilt = estimators.rebuild(record, model.estimator.state_dict())
    torch.testing.assert_close(estimators.NPELoss(rebuilt.eval())(theta, x), model.eval()(theta, x))


def test_embedding_shape_must_match_x() -> None:
    cfg = EstimatorSection(embedding="cnn", embedding_input_shape=[8, 8])
    with pytest.raises(RecipeError, match="holds 64 values, but x has 10"):
        estimators.embedding_net(estimators.BuildRecord.from_config(cfg, 2, 10))
    with pytest.raises(RecipeError, match="embedding_input_shape: CNN output size is zero"):
        estimators.embedding_net(estimators.BuildRecord.from_config(cfg, 2, 64))


def test_export_loads_as_an_sbi_direct_posterior(tmp_path: Path) -> None:
    from sbi.inference import DirectPosterior

    theta, x = _data()
    record = estimators.BuildRecord.from_config(EstimatorSection(), 2, 2)
    estimator = estimators.build(record, theta, x).eval()
    path = tmp_path / "posterior.pt"
    export.save_posterior(path, estimator, record, {"task": "two_moons"})
    assert not list(tmp_path.glob(".*tmp"))  # written atomically, nothing left over
    posterior = export.load_posterior(path)
    assert isinstance(posterior, DirectPosterior)
    x_obs = x[0]
    samples = posterior.sample((200,), x=x_obs, show_progress_bars=False)
    assert samples.shape == (200, 2)
    assert bool(((samples >= -1) & (samples <= 1)).all())  # inside the prior box (rejection)
    ours = estimator.log_prob(samples.unsqueeze(1), condition=x_obs.unsqueeze(0)).squeeze(1)
    theirs = posterior.log_prob(samples, x=x_obs, norm_posterior=False)
    torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-4)
    torch.save({"format": "something else"}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a trainforge posterior file"):
        export.load_posterior(tmp_path / "other.pt")


def test_split_follows_sbis_rule_and_is_deterministic() -> None:
    theta, x = _data(1000)
    (t1, _), (v1, _) = split(theta, x, 0.1, seed=3)
    (t2, _), (v2, _) = split(theta, x, 0.1, seed=3)
    assert len(t1) == 900 and len(v1) == 100
    torch.testing.assert_close(t1, t2)
    torch.testing.assert_close(v1, v2)
    rows = {tuple(r) for r in torch.cat([t1, v1]).tolist()}
    assert len(rows) == 1000  # a partition: nothing lost, nothing twice
    (t3, _), _ = split(theta, x, 0.1, seed=4)
    assert not torch.equal(t1, t3)


def test_early_stopping_stops_after_patience_and_keeps_the_best_weights() -> None:
    model = torch.nn.Linear(2, 1)
    stopper = EarlyStopping(patience=2, keep_best=True)
    decisions = []
    for epoch, loss in enumerate([3.0, 2.0, 2.5, 1.5, 1.6, 1.7, 1.4], start=1):
        with torch.no_grad():
            model.weight.fill_(loss)
        decisions.append(stopper.update(loss, epoch, model, CPU))
        if decisions[-1]:
            break
    assert decisions == [False, False, False, False, False, True]
    assert stopper.best == 1.5 and stopper.best_epoch == 4
    assert stopper.restore_best(model)
    assert float(model.weight[0, 0].detach()) == 1.5
    fresh = EarlyStopping(patience=2, keep_best=True)
    fresh.load_state_dict(stopper.state_dict(), torch.device("cpu"))
    assert fresh.stopped and fresh.best == 1.5 and fresh.best_weights is not None


def test_no_patience_never_stops() -> None:
    stopper = EarlyStopping(patience=0, keep_best=False)
    model = torch.nn.Linear(1, 1)
    assert not any(stopper.update(float(i), i, model, CPU) for i in range(1, 50))
    assert not stopper.restore_best(model)


# --- user simulators by import path ------------------------------------------------------

USER_MODULE = """
import numpy as np
import torch

PRIOR = torch.distributions.Independent(
    torch.distributions.Uniform(-torch.ones(2), torch.ones(2)), 1
)

def prior():
    return PRIOR

def simulate(theta):
    return theta + 0.1 * torch.randn_like(theta)

def wrong_rows(theta):
    return torch.zeros(len(theta) + 1, 2)

def integers(theta):
    return torch.zeros(len(theta), 2, dtype=torch.int64)

def not_a_tensor(theta):
    return [1.0, 2.0]

def numpy_sim(theta):
    return np.asarray(theta) * 2.0

def broken(theta):
    raise RuntimeError("solver diverged")

NOT_CALLABLE = 3
"""


@pytest.fixture
def user_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"user_sim_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)


def _custom(module: str, simulator: str, prior: str = "prior") -> SBIWorkloadConfig:
    return SBIWorkloadConfig(
        task="custom", prior=f"{module}:{prior}", simulator=f"{module}:{simulator}"
    )


def test_a_user_simulator_resolves(user_module: str) -> None:
    source = sources.resolve(_custom(user_module, "simulate"))
    assert (source.dim_theta, source.dim_x) == (2, 2)
    generator = torch.Generator().manual_seed(0)
    theta = source.sample_prior(10, generator)
    assert source.simulate(theta, generator).shape == (10, 2)
    assert source.fingerprint["simulator"] == f"{user_module}:simulate"
    numpy_source = sources.resolve(_custom(user_module, "numpy_sim"))
    assert numpy_source.simulate(theta, generator).dtype == torch.float32


@pytest.mark.parametrize(
    ("simulator", "prior", "message"),
    [
        ("wrong_rows", "prior", "returned shape [3, 2] for 2 parameter sets"),
        ("integers", "prior", "dtype torch.int64; need a floating dtype"),
        ("not_a_tensor", "prior", "returned list; it must return a torch tensor or numpy array"),
        ("broken", "prior", "failed on 2 prior draws: RuntimeError: solver diverged"),
        ("NOT_CALLABLE", "prior", "is not callable"),
        ("missing", "prior", "has no 'missing'"),
        ("simulate", "NOT_CALLABLE", "is int, not a torch Distribution"),
    ],
)
def test_bad_user_simulators_get_one_clear_error(
    user_module: str, simulator: str, prior: str, message: str
) -> None:
    with pytest.raises(sources.SimulatorError, match=re.escape(message)):
        sources.resolve(_custom(user_module, simulator, prior))


def test_import_failures_name_the_key() -> None:
    cfg = _custom("no_such_module_here", "simulate")
    with pytest.raises(
        RecipeError, match=r"workload\.prior: cannot import module 'no_such_module_"
    ):
        sources.resolve(cfg)
    cfg.prior = "just_a_name"
    with pytest.raises(RecipeError, match=r"is not an import path like 'my_pkg\.sim:simulate'"):
        sources.resolve(cfg)
    cfg.prior = None
    with pytest.raises(RecipeError, match="needs both prior and simulator"):
        sources.resolve(cfg)


def test_the_fingerprint_follows_the_simulators_source(user_module: str, tmp_path: Path) -> None:
    before = sources.resolve(_custom(user_module, "simulate")).fingerprint
    (tmp_path / f"{user_module}.py").write_text(USER_MODULE.replace("0.1 *", "0.2 *"))
    sys.modules.pop(user_module)
    after = sources.resolve(_custom(user_module, "simulate")).fingerprint
    assert before["simulator_source"] != after["simulator_source"]
    assert before["prior_source"] == after["prior_source"]  # the prior function is unchanged
