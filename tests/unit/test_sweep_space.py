"""`trainforge sweep`'s search space: the distributions a recipe writes under ``sweep.space``
(``trainforge.config.sweep_space``), the section's own checks, the space checked against the
recipe before anything starts (``driver.sweep.check``), and the command's refusals."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from omegaconf import OmegaConf

from trainforge import config
from trainforge.config.schema import SweepSection
from trainforge.config.sweep_space import Dimension, override_value, parse
from trainforge.driver import sweep
from trainforge.errors import RecipeError

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "recipes" / "cnn" / "digits_simple_cnn.yaml"
LR = "sweep.space.train.lr=loguniform(1e-4, 1e-1)"


def _subprocess_env(tmp_path: Path) -> dict[str, str]:
    env = dict(os.environ) | {"OMP_NUM_THREADS": "1", "TRAINFORGE_HOME": str(tmp_path / "home")}
    for name in ("MLFLOW_TRACKING_URI", "RAY_ADDRESS"):  # the defaults: ./mlflow.db, ./runs
        env.pop(name, None)
    return env


def _only(space: dict[str, Any]) -> Dimension:
    dimensions = parse(space)
    assert len(dimensions) == 1, dimensions
    return dimensions[0]


# --- the distributions ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "kind", "values"),
    [
        ("loguniform(1e-4, 1e-1)", "loguniform", (0.0001, 0.1)),
        ("loguniform(1E-4,2e+2)", "loguniform", (0.0001, 200.0)),
        ("uniform(0, 1)", "uniform", (0.0, 1.0)),
        ("  uniform( -0.5 , .5 )  ", "uniform", (-0.5, 0.5)),
        ("randint(8, 64)", "randint", (8, 64)),
        ("randint(3, 3)", "randint", (3, 3)),
        ("choice(64, 128)", "choice", (64, 128)),
        ("choice(adam, sgd)", "choice", ("adam", "sgd")),
        ("choice(0.5, 1e-3, adamw, true, false)", "choice", (0.5, 0.001, "adamw", True, False)),
        ("choice(only)", "choice", ("only",)),
        ([32, 64, 128], "choice", (32, 64, 128)),
        (["adam", True, 0.1], "choice", ("adam", True, 0.1)),
    ],
)
def test_each_distribution_reads_as_its_kind_and_values(
    written: Any, kind: str, values: tuple[Any, ...]
) -> None:
    dimension = _only({"train.lr": written})
    assert dimension == Dimension("train.lr", kind, values)
    # 1 and 1.0, True and 1 compare equal: the types are what the trials' overrides write
    assert [type(v) for v in dimension.values] == [type(v) for v in values]


def test_an_exponent_without_a_dot_is_a_float_as_the_recipe_reads_it() -> None:
    """PyYAML reads `1e-4` as text; OmegaConf, and so the recipe, as 0.0001."""
    low, high = _only({"train.lr": "loguniform(1e-4, 1e-1)"}).values
    assert isinstance(low, float) and isinstance(high, float)
    assert (low, high) == (1e-4, 1e-1)
    assert config.load(DIGITS, ["train.lr=1e-4"]).train.lr == low


def test_uniform_ends_written_as_integers_are_floats_and_randint_ends_stay_integers() -> None:
    assert _only({"k": "uniform(1, 2)"}).values == (1.0, 2.0)
    assert all(type(v) is float for v in _only({"k": "uniform(1, 2)"}).values)
    assert all(type(v) is int for v in _only({"k": "randint(1, 2)"}).values)


def test_nested_and_dotted_keys_name_the_same_setting() -> None:
    dotted = parse({"train.lr": "uniform(0.1, 0.2)", "train.batch_size": "randint(8, 64)"})
    nested = parse({"train": {"lr": "uniform(0.1, 0.2)", "batch_size": "randint(8, 64)"}})
    half = parse({"train": {"lr": "uniform(0.1, 0.2)"}, "train.batch_size": "randint(8, 64)"})
    assert dotted == nested == half
    assert [d.key for d in dotted] == ["train.lr", "train.batch_size"]  # the order written
    deep = _only({"workload": {"model_kwargs": {"width": "choice(8, 16)"}}})
    assert deep.key == "workload.model_kwargs.width"


def test_a_space_loaded_from_an_override_or_a_recipe_file_reads_the_same(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        DIGITS.read_text()
        + "sweep:\n  space:\n    train.lr: loguniform(1e-4, 1e-1)\n    train.batch_size: [16, 32]\n"
    )
    from_file = parse(config.load(recipe).sweep.space)
    overridden = config.load(DIGITS, [LR, "sweep.space.train.batch_size=[16, 32]"])
    assert from_file == parse(overridden.sweep.space)
    assert from_file == [
        Dimension("train.lr", "loguniform", (0.0001, 0.1)),
        Dimension("train.batch_size", "choice", (16, 32)),
    ]


def test_an_override_replaces_the_distribution_a_recipe_writes_dotted(tmp_path: Path) -> None:
    """An override's key is always nested (sweep.space.train.lr=…): it replaces the recipe's
    `train.lr:` rather than standing beside it, whichever the order the recipe writes."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        DIGITS.read_text() + "sweep:\n  space:\n    train:\n      batch_size: randint(8, 64)\n"
        "    train.lr: loguniform(1e-4, 1e-1)\n"
    )  # fmt: skip
    cfg = config.load(recipe, ["sweep.space.train.lr=choice(0.01, 0.02)"])
    assert parse(cfg.sweep.space) == [
        Dimension("train.batch_size", "randint", (8, 64)),
        Dimension("train.lr", "choice", (0.01, 0.02)),
    ]
    assert cfg.sweep.space == {"train": {"batch_size": "randint(8, 64)",
                                         "lr": "choice(0.01, 0.02)"}}  # fmt: skip


@pytest.mark.parametrize(
    ("value", "written"),
    [
        (0.1, "0.1"),
        (1e-4, "0.0001"),
        (1e-10, "1e-10"),
        (2.5e20, "2.5e+20"),
        (1.0, "1.0"),
        (0.30000000000000004, "0.30000000000000004"),  # repr: every digit kept
        (64, "64"),
        (True, "true"),
        (False, "false"),
        ("adamw", "adamw"),
    ],
)
def test_override_value_is_written_as_the_command_line_reads_it_back(
    value: Any, written: str
) -> None:
    assert override_value(value) == written
    read = OmegaConf.from_dotlist([f"k={written}"]).k  # as the trial's override is read
    assert read == value and type(read) is type(value)


def test_written_shows_the_distribution_as_a_recipe_writes_it() -> None:
    assert _only({"k": "loguniform(1e-4, 1e-1)"}).written() == "loguniform(0.0001, 0.1)"
    assert _only({"k": "randint(8, 64)"}).written() == "randint(8, 64)"
    assert _only({"k": [True, "x", 2]}).written() == "choice(true, x, 2)"


def test_every_end_and_every_choice_are_the_candidates_checked() -> None:
    assert _only({"k": "uniform(0.1, 0.5)"}).candidates() == (0.1, 0.5)
    assert _only({"k": "choice(a, b, c)"}).candidates() == ("a", "b", "c")


# --- refusals by the space and the section -------------------------------------------------


@pytest.mark.parametrize(
    ("space", "key", "says"),
    [
        ({"train.lr": "normal(0, 1)"}, "train.lr", "is not one of uniform(…), loguniform(…)"),
        ({"train.lr": "Uniform(0, 1)"}, "train.lr", "is not one of"),
        ({"train.lr": "uniform 0, 1"}, "train.lr", "is not one of"),
        ({"train.lr": "0.01"}, "train.lr", "is not one of"),
        ({"train.lr": "uniform(0.1)"}, "train.lr", "uniform takes two values (low, high)"),
        ({"train.lr": "loguniform(1, 2, 3)"}, "train.lr", "loguniform takes two values"),
        ({"train.batch_size": "randint()"}, "train.batch_size", "randint takes two values"),
        ({"train.lr": "uniform(0.2, 0.1)"}, "train.lr", "low 0.2 must be below its high 0.1"),
        ({"train.lr": "uniform(0.1, 0.1)"}, "train.lr", "low 0.1 must be below its high 0.1"),
        ({"train.lr": "loguniform(0, 1)"}, "train.lr", "loguniform needs a low above 0, got 0"),
        ({"train.lr": "loguniform(-1, 1)"}, "train.lr", "loguniform needs a low above 0"),
        ({"train.batch_size": "randint(64, 8)"}, "train.batch_size", "low 64 is above its high 8"),
        ({"train.batch_size": "randint(8.0, 64)"}, "train.batch_size", "two integers"),
        ({"train.batch_size": "randint(8, 6.4e1)"}, "train.batch_size", "two integers"),
        ({"train.batch_size": "randint(true, 8)"}, "train.batch_size", "two integers"),
        ({"train.lr": "uniform(.nan, 1)"}, "train.lr", "two finite numbers"),
        ({"train.lr": "uniform(0, .inf)"}, "train.lr", "two finite numbers"),
        ({"train.lr": "uniform(0, inf)"}, "train.lr", "two finite numbers"),
        ({"train.lr": "uniform(a, b)"}, "train.lr", "two finite numbers"),
        ({"train.lr": "uniform(false, 1)"}, "train.lr", "two finite numbers"),
        ({"train.lr": "choice(0.1, .nan)"}, "train.lr", "choice takes finite numbers"),
        ({"train.optimizer": "choice()"}, "train.optimizer", "needs at least one value"),
        ({"train.optimizer": []}, "train.optimizer", "needs at least one value"),
        ({"train.optimizer": "choice(adam, sgd, adam)"}, "train.optimizer", "a value twice"),
        ({"train.optimizer": "choice(adam, 'adam')"}, "train.optimizer", "a value twice"),
        ({"train.lr": "choice(1e-4, 0.0001)"}, "train.lr", "a value twice"),
        ({"train.lr": [0.1, 0.1]}, "train.lr", "a value twice"),
        ({"workload.model": "choice({a: 1})"}, "workload.model", "plain values"),
        ({"workload.model": "choice([a, b])"}, "workload.model", "plain values"),
        ({"workload.model": "choice(a, null)"}, "workload.model", "plain values"),
        ({"workload.model": [{"a": 1}]}, "workload.model", "plain values"),
        ({"workload.model": "choice(a, [b)"}, "workload.model", "cannot read the values"),
        ({"train.lr": 0.01}, "train.lr", "must be a distribution such as loguniform"),
        ({"train.batch_size": 32}, "train.batch_size", "must be a distribution"),
        ({"train.shuffle": True}, "train.shuffle", "must be a distribution"),
        ({"train.lr": None}, "train.lr", "must be a distribution"),
        ({"train": {}}, "train", "an empty mapping searches nothing"),
        ({"workload": {"model_kwargs": {}}}, "workload.model_kwargs", "an empty mapping"),
        ({"run.name": "choice(a, b)"}, "run.name", "set by the sweep for each trial"),
        ({"run": {"name": "choice(a, b)"}}, "run.name", "set by the sweep for each trial"),
        ({"run.storage_path": "choice(a, b)"}, "run.storage_path", "set by the sweep"),
        ({"checkpoint.resume": [True, False]}, "checkpoint.resume", "set by the sweep"),
        ({"sweep.trials": "randint(1, 4)"}, "sweep.trials", "the sweep's own settings"),
        ({"sweep": {"metric": "choice(a, b)"}}, "sweep.metric", "the sweep's own settings"),
        ({"train.lr": "uniform(0, 1)", "train": {"lr": [0.1]}}, "train.lr", "written twice"),
        ({"train": {"lr": [0.1]}, "train.lr": "uniform(0, 1)"}, "train.lr", "written twice"),
    ],
)
def test_a_space_that_cannot_be_searched_is_refused_naming_its_full_key(
    space: dict[str, Any], key: str, says: str
) -> None:
    with pytest.raises(RecipeError) as refused:
        parse(space)
    assert str(refused.value).startswith(f"sweep.space.{key}: "), refused.value
    assert says in str(refused.value)
    with pytest.raises(RecipeError) as again:
        SweepSection(space=space)  # the section checks itself as it is built
    assert str(again.value) == str(refused.value)


def test_a_distribution_and_keys_under_it_in_one_space_are_refused(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        DIGITS.read_text() + "sweep:\n  space:\n    train: uniform(0, 1)\n"
        "    train.lr: loguniform(1e-4, 1e-1)\n"
    )  # fmt: skip
    with pytest.raises(RecipeError, match=r"^sweep\.space\.train: written both as a distribution"):
        config.load(recipe)


@pytest.mark.parametrize(
    ("override", "says"),
    [
        ("sweep.trials=0", "sweep.trials: must be >= 1, got 0"),
        ("sweep.trials=-3", "sweep.trials: must be >= 1"),
        ("sweep.at_once=-1", "sweep.at_once: must be >= 0"),
        ("sweep.grace_epochs=0", "sweep.grace_epochs: must be >= 1"),
        ("sweep.metric='val loss!'", "sweep.metric: must be a metric's name such as val/loss"),
        ("sweep.metric=val/loss;rm", "sweep.metric: must be a metric's name"),
        ("sweep.metric=''", "sweep.metric: must be a metric's name"),
        ("sweep.scheduler=hyperband", "sweep.scheduler"),
        ("sweep.search=bayes", "sweep.search"),
        ("sweep.space.train.lr=normal(0, 1)", "sweep.space.train.lr: 'normal(0, 1)' is not one"),
        ("sweep.space.train.lr=3", "sweep.space.train.lr: must be a distribution"),
        ("sweep.space.workload={}", "sweep.space.workload: an empty mapping searches nothing"),
        ("sweep.space.train.lr=[0.1, .inf]", "sweep.space"),  # the recipe's check of any value
        ("sweep.space.run.name=choice(a, b)", "sweep.space.run.name: set by the sweep"),
        ("sweep.space=3", "sweep.space: must be a mapping"),
    ],
)
def test_a_bad_sweep_setting_is_refused_as_the_recipe_loads(override: str, says: str) -> None:
    with pytest.raises(RecipeError) as refused:
        config.load(DIGITS, [LR, override])
    assert str(refused.value).startswith(says), refused.value


def test_the_section_defaults_and_direction() -> None:
    section = config.load(DIGITS).sweep
    assert section == SweepSection()
    assert (section.space, section.trials, section.metric) == ({}, 8, "val/loss")
    assert (section.search, section.scheduler) == ("optuna", "asha")
    assert section.direction() == "min"
    assert SweepSection(metric="val/accuracy").direction() == "max"
    assert SweepSection(metric="val/accuracy", mode="min").direction() == "min"


# --- the space checked against the recipe --------------------------------------------------


def _check(*overrides: str) -> list[Dimension]:
    return sweep.check(config.load(DIGITS, list(overrides)), DIGITS, list(overrides))


def test_a_space_the_recipe_loads_everywhere_is_its_dimensions() -> None:
    dimensions = _check(LR, "sweep.space.train.batch_size=randint(8, 64)",
                        "sweep.space.train.optimizer=[adam, sgd]")  # fmt: skip
    assert dimensions == [
        Dimension("train.lr", "loguniform", (0.0001, 0.1)),
        Dimension("train.batch_size", "randint", (8, 64)),
        Dimension("train.optimizer", "choice", ("adam", "sgd")),
    ]


@pytest.mark.parametrize(
    ("distribution", "reached", "why"),
    [
        ("train.batch_size=randint(1, 100000)", "100000", "is more than a worker's shard"),
        ("train.batch_size=randint(0, 64)", "0", "train.batch_size: must be >= 1"),
        ("train.batch_size=uniform(8, 64)", "8.0", "expected integer"),
        ("train.batch_size=choice(32, big)", "big", "train.batch_size"),
        ("train.optimizer=choice(adam, nope)", "nope", "train.optimizer"),
        ("train.lr=uniform(-0.1, 0.1)", "-0.1", "train.lr: must be > 0"),
        ("train.min_lr_ratio=uniform(0.5, 2)", "2.0", "train.min_lr_ratio: must be in [0, 1]"),
        ("train.nope=uniform(0.1, 0.2)", "0.1", "train.nope"),
    ],
)
def test_a_value_the_space_reaches_that_the_recipe_refuses_is_named_before_anything_starts(
    distribution: str, reached: str, why: str
) -> None:
    key = distribution.split("=", 1)[0]
    with pytest.raises(RecipeError) as refused:
        _check(f"sweep.space.{distribution}")
    said = str(refused.value)
    assert said.startswith(f"sweep.space.{key}: "), said
    assert f" reaches {reached}, which the recipe refuses (" in said
    assert why in said.split("which the recipe refuses", 1)[1]


def test_the_command_lines_overrides_apply_to_the_values_checked() -> None:
    """A batch of 300 fits a worker's shard of 719 samples with 2 workers, not of 288 with 5."""
    batch = "sweep.space.train.batch_size=randint(8, 300)"
    assert _check(batch)[0].values == (8, 300)
    with pytest.raises(RecipeError, match=r"^sweep\.space\.train\.batch_size: .* reaches 300,"):
        _check(batch, "scaling.num_workers=5")


def test_a_metric_measured_once_needs_fifo_not_asha() -> None:
    with pytest.raises(RecipeError) as refused:
        _check(LR, "sweep.metric=c2st/mean")
    assert str(refused.value).startswith("sweep.metric: c2st/mean is measured once")
    assert "sweep.scheduler=fifo" in str(refused.value)
    assert _check(LR, "sweep.metric=c2st/mean", "sweep.scheduler=fifo")[0].key == "train.lr"
    assert _check(LR, "sweep.metric=val/accuracy")[0].key == "train.lr"  # each epoch: asha
    assert _check(LR, "sweep.metric=train/loss")[0].key == "train.lr"


def test_a_grid_runs_every_combination_of_choices_and_refuses_a_drawn_value() -> None:
    grid = ["sweep.search=grid", "sweep.space.train.lr=choice(0.001, 0.01, 0.1)",
            "sweep.space.train.batch_size=[16, 32]"]  # fmt: skip
    dimensions = _check(*grid)
    cfg = config.load(DIGITS, grid)
    assert sweep.trial_count(cfg.sweep, dimensions) == 6  # not sweep.trials (8)
    assert sweep.trial_count(config.load(DIGITS, grid[1:]).sweep, dimensions) == 8
    with pytest.raises(RecipeError) as refused:
        _check("sweep.search=grid", "sweep.space.train.lr=loguniform(1e-4, 1e-1)")
    assert str(refused.value).startswith("sweep.search: grid tries every combination")
    assert "sweep.space.train.lr is loguniform(0.0001, 0.1)" in str(refused.value)


def test_an_empty_space_is_refused_saying_how_to_name_one() -> None:
    with pytest.raises(RecipeError, match=r"^sweep\.space: empty; name the settings to search"):
        _check()
    with pytest.raises(RecipeError, match=r"^sweep\.space: empty"):
        _check("sweep.scheduler=fifo", "sweep.trials=2")


# --- the command ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "space",
    [
        "sweep.space.train.batch_size=randint(1, 100000)",  # refused by the recipe (check)
        "sweep.space.train.lr=normal(0, 1)",  # refused as the recipe loads
    ],
)
def test_sweep_with_a_bad_space_is_one_error_line_and_starts_nothing(
    tmp_path: Path, space: str
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trainforge", "sweep", str(DIGITS), space, "--trials", "2"],
        capture_output=True, text=True, cwd=tmp_path, env=_subprocess_env(tmp_path), timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    key = space.split("=", 1)[0]
    assert lines[0].startswith(f"trainforge: error: {key}: "), done.stderr
    assert done.stdout == ""
    assert not (tmp_path / "runs").exists() and not (tmp_path / "mlflow.db").exists()
    assert [p.name for p in tmp_path.iterdir()] == [], "the refused command wrote files"


def test_validate_shows_the_sweep_section_with_its_keys_nested(tmp_path: Path) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        DIGITS.read_text() + "sweep:\n  space:\n    train.lr: loguniform(1e-4, 1e-1)\n"
        "    train.optimizer: [adam, sgd]\n  trials: 3\n  scheduler: fifo\n"
    )  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "trainforge", "validate", str(recipe), "sweep.trials=5"],
        capture_output=True, text=True, cwd=tmp_path, env=_subprocess_env(tmp_path), timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    shown = yaml.safe_load(done.stdout)["sweep"]
    assert shown["space"] == {
        "train": {"lr": "loguniform(1e-4, 1e-1)", "optimizer": ["adam", "sgd"]}
    }
    assert (shown["trials"], shown["scheduler"], shown["metric"]) == (5, "fifo", "val/loss")
    assert (shown["search"], shown["mode"]) == ("optuna", "auto")
