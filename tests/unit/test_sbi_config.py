"""The SBI workload's recipe sections (``trainforge.workloads.sbi.config``) through
``config.load``: bad values name their key, every shipped SBI recipe validates, and one recipe
per simulation budget takes any task."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainforge import config
from trainforge.errors import RecipeError
from trainforge.workloads.sbi.methods import NAMES as METHODS
from trainforge.workloads.sbi.tasks import TASKS

ROOT = Path(__file__).resolve().parents[2]
DEBUG = ROOT / "recipes" / "sbi" / "two_moons_debug.yaml"


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
        ("workload.simulation.where=gpu", "workload.simulation.where: 'gpu'"),
        (
            "workload.simulation.where=here workload.simulation.device=cuda",
            "workload.simulation.where: here simulates on this machine's CPU, and device is cuda",
        ),
        ("train.early_stopping_patience=-1", "train.early_stopping_patience: must be >= 0"),
        ("train.lr_scaling=cubic", "train.lr_scaling: 'cubic' is not one of"),
        ("precision.cuda_graphs=true train.grad_accum_steps=2", "needs train.grad_accum_steps=1"),
        ("precision.cuda_graphs=true precision.compile=true", "needs precision.compile=false"),
        ("workload.prior=a:b", "only used with task: custom"),
        ("workload.method=npr", f"workload.method: 'npr' is not one of {', '.join(METHODS)} ("),
        (
            "workload.method=nle workload.estimator.embedding=fully_connected",
            "workload.estimator.embedding: method nle learns the likelihood q(x | θ), whose x "
            "takes no embedding net; remove it (fully_connected) or use method npe",
        ),
        ("workload.posterior.num_chains=0", "workload.posterior.num_chains: must be >= 1"),
        ("workload.posterior.mcmc_method=nuts", "workload.posterior.mcmc_method: 'nuts'"),
        (
            "workload.method=npse workload.estimator.model=mlp scaling.use_gpu=true "
            "precision.cuda_graphs=true",
            "precision.cuda_graphs: method npse's step cannot be captured as a CUDA graph: sbi's "
            "vector-field loss reads",
        ),
    ],
)
def test_bad_sbi_recipe_values_name_their_key(override: str, message: str) -> None:
    with pytest.raises(RecipeError, match=re.escape(message)):
        config.load(DEBUG, override.split())


def test_an_unknown_method_is_one_line_naming_the_methods_before_anything_starts(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainforge import cli
    from trainforge.driver import launch

    def must_not_run(*args: object) -> None:
        raise AssertionError("dispatched with an unknown method")

    monkeypatch.setattr(launch, "train", must_not_run)
    assert cli.main(["train", str(DEBUG), "workload.method=foo"]) == 2
    err = capsys.readouterr().err
    assert err == f"trainforge: error: workload.method: 'foo' is not one of {', '.join(METHODS)}\n"


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


@pytest.mark.parametrize(
    ("overrides", "here"),
    [
        ([], True),  # two_moons, 10^4: milliseconds of one core
        (["workload.simulation.num_simulations=10000000"], True),  # ~1.3 s of one core
        (["workload.task=slcp", "workload.simulation.num_simulations=1000000"], True),
        (["workload.task=bernoulli_glm", "workload.simulation.num_simulations=1000000"], True),
        (["workload.task=bernoulli_glm", "workload.simulation.num_simulations=2000000"], False),
        (["workload.simulation.device=cuda"], False),  # the recipe asks for the GPUs
        (["workload.simulation.where=cluster"], False),
        (
            [
                "workload.task=bernoulli_glm",
                "workload.simulation.num_simulations=2000000",
                "workload.simulation.where=here",
            ],
            True,
        ),
        (["workload.task=custom", "workload.prior=m:p", "workload.simulator=m:s"], False),
        (
            [
                "workload.task=custom",
                "workload.prior=m:p",
                "workload.simulator=m:s",
                "workload.simulation.where=here",
            ],
            True,
        ),
    ],
)
def test_where_the_simulations_are_made(overrides: list[str], here: bool) -> None:
    """auto: here when a built-in task's simulations cost one core seconds at most (the
    catalogue's measured cost), on the cluster for a user's simulator (its cost unknown)."""
    from trainforge.workloads.sbi import simulate

    section = config.load(DEBUG, overrides).workload
    assert simulate.simulates_here(section) is here
