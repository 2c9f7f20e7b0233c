"""The SBI workload's recipe sections (``trainforge.workloads.sbi.config``) through
``config.load``: bad values name their key, every shipped SBI recipe validates, and one recipe
per simulation budget takes any task."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from trainforge import config
from trainforge.errors import RecipeError
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
        ("train.early_stopping_patience=-1", "train.early_stopping_patience: must be >= 0"),
        ("train.lr_scaling=cubic", "train.lr_scaling: 'cubic' is not one of"),
        ("precision.cuda_graphs=true train.grad_accum_steps=2", "needs train.grad_accum_steps=1"),
        ("precision.cuda_graphs=true precision.compile=true", "needs precision.compile=false"),
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
