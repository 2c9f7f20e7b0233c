"""Recipe loading and validation (trainforge.config): each mistake is one RecipeError naming
its key."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from trainforge import config
from trainforge.config.schema import TrainSection
from trainforge.errors import RecipeError

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "recipes").rglob("*.yaml"))
DIGITS = REPO / "recipes" / "cnn" / "digits_simple_cnn.yaml"


def _write(tmp_path: Path, text: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# --- shipped recipes ---------------------------------------------------------------------------


def test_recipes_are_found() -> None:
    assert DIGITS in RECIPES
    assert len(RECIPES) >= 3


@pytest.mark.parametrize("recipe", RECIPES, ids=[str(p.relative_to(REPO)) for p in RECIPES])
def test_every_recipe_loads(recipe: Path) -> None:
    cfg = config.load(recipe)
    assert isinstance(cfg.run.name, str) and cfg.run.name.strip()
    expected = cfg.train.batch_size * cfg.scaling.num_workers * cfg.train.grad_accum_steps
    assert config.global_batch(cfg) == expected


def test_global_batch_multiplies_all_three_factors() -> None:
    cfg = config.load(
        DIGITS, ["train.batch_size=8", "scaling.num_workers=3", "train.grad_accum_steps=5"]
    )
    assert config.global_batch(cfg) == 8 * 3 * 5


# --- bad overrides -----------------------------------------------------------------------------

BAD_OVERRIDES = [
    # unknown keys, with a hint
    ("train.lrr=1", r"train\.lrr.*did you mean 'train\.lr'"),
    ("lr=3", r"lr.*'train\.lr'"),
    # wrong types
    ("train.lr=abc", r"train\.lr"),
    ("train.epochs=1.5", r"train\.epochs"),
    ("scaling.num_workers=two", r"scaling\.num_workers"),
    # impossible values
    ("train.lr=0", r"train\.lr"),
    ("train.lr=-1", r"train\.lr"),
    ("train.lr=nan", r"train\.lr"),
    ("train.grad_accum_steps=0", r"train\.grad_accum_steps"),
    ("scaling.num_workers=0", r"scaling\.num_workers"),
    ("train.batch_size=0", r"train\.batch_size"),
    ("precision.dtype=fp8", r"precision\.dtype"),
    ("scaling.use_gpu=maybe", r"scaling\.use_gpu"),
    ("train.optimizer=lion", r"train\.optimizer"),
    ("checkpoint.keep_last=0", r"checkpoint\.keep_last"),
    ("workload.kind=cnm", r"workload\.kind.*did you mean 'cnn'"),
    ("workload.modle=x", r"workload\.modle.*did you mean 'workload\.model'"),
    ("workload.model=simple_cn", r"workload\.model"),
    pytest.param("workload.dataset=mnist", r"workload\.dataset", id="workload.dataset=mnist"),
    # malformed override
    ("train.lr", r"train\.lr"),
]


@pytest.mark.parametrize(
    ("override", "pattern"),
    [case if hasattr(case, "marks") else pytest.param(*case, id=case[0]) for case in BAD_OVERRIDES],
)
def test_bad_override_is_one_recipe_error_naming_the_key(override: str, pattern: str) -> None:
    with pytest.raises(RecipeError, match=pattern) as info:
        config.load(DIGITS, [override])
    assert "\n" not in str(info.value)


def test_unknown_key_message_is_exact() -> None:
    with pytest.raises(RecipeError) as info:
        config.load(DIGITS, ["train.lrr=1"])
    message = str(info.value)
    assert "train.lrr" in message
    assert "did you mean 'train.lr'" in message


def test_malformed_override_names_it() -> None:
    with pytest.raises(RecipeError, match=re.escape("'train.lr'")) as info:
        config.load(DIGITS, ["train.lr"])
    assert "key=value" in str(info.value)


def test_scalar_for_a_whole_section_names_the_section() -> None:
    with pytest.raises(RecipeError, match=r"^train\b"):
        config.load(DIGITS, ["train=1"])


# --- missing values and unreadable files -------------------------------------------------------


def test_missing_run_name(tmp_path: Path) -> None:
    path = _write(tmp_path, "workload:\n  kind: cnn\n")
    with pytest.raises(RecipeError, match=r"run\.name.*missing"):
        config.load(path)


def test_missing_workload_section(tmp_path: Path) -> None:
    path = _write(tmp_path, "run:\n  name: x\n")
    with pytest.raises(RecipeError, match=r"^workload\b"):
        config.load(path)


def test_workload_without_kind(tmp_path: Path) -> None:
    path = _write(tmp_path, "run:\n  name: x\nworkload: {}\n")
    with pytest.raises(RecipeError, match=r"workload\.kind"):
        config.load(path)


def test_recipe_not_found_names_the_path(tmp_path: Path) -> None:
    path = tmp_path / "nowhere" / "recipe.yaml"
    with pytest.raises(RecipeError, match=re.escape(str(path))):
        config.load(path)


def test_recipe_that_is_a_list(tmp_path: Path) -> None:
    path = _write(tmp_path, "- a\n- b\n")
    with pytest.raises(RecipeError, match="mapping"):
        config.load(path)


@pytest.mark.parametrize(
    "text", ["run:\n  name: [x\n", "run:\n\tname: x\n"], ids=["unclosed", "tab"]
)
def test_yaml_syntax_error_is_a_recipe_error(tmp_path: Path, text: str) -> None:
    path = _write(tmp_path, text)
    try:
        config.load(path)
    except RecipeError as exc:
        assert str(path) in str(exc)
    else:
        pytest.fail("a YAML syntax error loaded without error")


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        ("run:\n  name: x\ntrain:\n  lr: [1, 2\n  epochs: 3\n", "5:9", "expected ',' or ']'"),
        ("run:\n  name: x\n   bad: 1\n", "3:7", "mapping values are not allowed"),
        ("run:\n\tname: x\n", "2:1", "cannot start any token"),
    ],
    ids=["unclosed", "indent", "tab"],
)
def test_yaml_syntax_error_keeps_file_line_and_column(
    tmp_path: Path, text: str, where: str, problem: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(RecipeError) as caught:
        config.load(path)
    message = str(caught.value)
    assert message.startswith(f"recipe {path}:{where}: YAML syntax error: ")
    assert problem in message and "\n" not in message


# --- precedence and normalisation --------------------------------------------------------------


def test_overrides_win_over_recipe_and_recipe_over_defaults() -> None:
    defaults = OmegaConf.structured(TrainSection)
    plain = config.load(DIGITS)
    # the recipe's values replace the defaults
    assert plain.train.batch_size == 32 != defaults.batch_size
    assert plain.train.optimizer == "adam" != defaults.optimizer
    assert plain.scaling.num_workers == 2
    # untouched keys keep the defaults
    assert plain.train.grad_accum_steps == defaults.grad_accum_steps
    assert plain.precision.dtype == "fp32"

    cfg = config.load(
        DIGITS, ["train.batch_size=7", "train.optimizer=sgd", "run.name=other", "train.lr=0.5"]
    )
    assert cfg.train.batch_size == 7
    assert cfg.train.optimizer == "sgd"
    assert cfg.run.name == "other"
    assert cfg.train.lr == 0.5
    assert isinstance(cfg.train.lr, float)
    # the rest of the recipe is still there
    assert cfg.train.schedule == "cosine"
    assert cfg.workload.model == "simple_cnn"


@pytest.mark.parametrize(("written", "normalised"), [("true", "true"), ("false", "false")])
def test_use_gpu_yaml_bool_is_normalised(tmp_path: Path, written: str, normalised: str) -> None:
    path = _write(
        tmp_path, f"run:\n  name: x\nscaling:\n  use_gpu: {written}\nworkload:\n  kind: cnn\n"
    )
    cfg = config.load(path)
    assert cfg.scaling.use_gpu == normalised
    assert isinstance(cfg.scaling.use_gpu, str)


def test_container_round_trip() -> None:
    cfg = config.load(DIGITS, ["train.lr=0.01", "scaling.resources_per_worker.CPU=2"])
    data = config.to_container(cfg)
    assert isinstance(data, dict)
    again = config.from_container(data)
    assert config.to_yaml(again) == config.to_yaml(cfg)
    assert again.scaling.resources_per_worker == {"CPU": 2.0}
    assert again.workload.kind == "cnn"


def test_from_container_validates() -> None:
    data = config.to_container(config.load(DIGITS))
    data["train"]["lr"] = 0.0
    with pytest.raises(RecipeError, match=r"train\.lr"):
        config.from_container(data)


def test_lr_scaling() -> None:
    train = TrainSection(lr=1e-3, lr_reference_batch=256, lr_scaling="linear")
    assert config.scaled_lr(train, 1024) == pytest.approx(4e-3)
    train = dataclasses.replace(train, lr_scaling="sqrt")
    assert config.scaled_lr(train, 1024) == pytest.approx(2e-3)
    train = dataclasses.replace(train, lr_scaling="none")
    assert config.scaled_lr(train, 1024) == pytest.approx(1e-3)
