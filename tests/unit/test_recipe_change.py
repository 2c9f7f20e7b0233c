"""A changed recipe on an existing run (``trainforge.driver.recipe_change``): refused naming the
changed keys, resumed with ``checkpoint.allow_changes`` (and said), and the keys that cannot
change results passing silently — compared with the recipe in the latest valid checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainforge import checkpoint, config
from trainforge.driver import recipe_change
from trainforge.errors import RecipeError

DIGITS = Path(__file__).resolve().parents[2] / "recipes" / "cnn" / "digits_simple_cnn.yaml"
BASE = ("run.name=r", "train.epochs=3")


def recipe(*overrides: str) -> config.Recipe:
    return config.load(DIGITS, [*BASE, *overrides])


def checkpointed(root: Path, step: int, *overrides: str) -> Path:
    """A real checkpoint of run ``r`` under ``root``, saved with the given recipe."""
    folder = root / "r" / f"checkpoint_{step:06d}"
    folder.mkdir(parents=True)
    checkpoint.save(folder, {"global_step": step}, config.to_yaml(recipe(*overrides)))
    return folder


def test_a_changed_recipe_is_refused_naming_the_keys(tmp_path: Path) -> None:
    recipe_change.check(recipe("train.lr=0.5"), str(tmp_path))  # no run yet: nothing to compare
    checkpointed(tmp_path, 10)
    recipe_change.check(recipe(), str(tmp_path))  # the same recipe resumes
    with pytest.raises(RecipeError) as refused:
        recipe_change.check(recipe("train.lr=0.01", "workload.augment=true"), str(tmp_path))
    message = str(refused.value)
    assert "train.lr 0.002 -> 0.01" in message and "workload.augment False -> True" in message
    assert "checkpoint.allow_changes=true" in message
    assert "tracking" not in message and "train.epochs" not in message


def test_allow_changes_resumes_and_says_what_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpointed(tmp_path, 10)
    recipe_change.check(recipe("train.lr=0.01", "checkpoint.allow_changes=true"), str(tmp_path))
    err = capsys.readouterr().err.splitlines()
    assert err == ["[trainforge] warning: resuming run 'r' with a changed recipe: "
                   "train.lr 0.002 -> 0.01"]  # fmt: skip


def test_keys_that_cannot_change_results_pass_silently(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    checkpointed(tmp_path, 10, "train.max_steps=50")
    harmless = ("train.log_every_steps=3", "train.epochs=9", "train.max_steps=80",
                "checkpoint.every_steps=7", "checkpoint.keep_last=5", "tracking.enabled=false",
                "tracking.experiment=x", "run.max_failures=2", "scaling.timeout_s=60")  # fmt: skip
    recipe_change.check(recipe(*harmless), str(tmp_path))
    assert capsys.readouterr().err == ""
    for shortened in ("train.epochs=2", "train.max_steps=20", "train.max_steps=null"):
        with pytest.raises(RecipeError, match=shortened.split("=")[0].replace(".", r"\.")):
            recipe_change.check(recipe(shortened), str(tmp_path))


def test_the_comparison_is_with_the_latest_valid_checkpoint(tmp_path: Path) -> None:
    checkpointed(tmp_path, 10, "train.lr=0.01")
    newest = checkpointed(tmp_path, 20, "train.lr=0.02")  # resumed once with allow_changes
    recipe_change.check(recipe("train.lr=0.02"), str(tmp_path))
    (newest / checkpoint.MANIFEST_FILE).unlink()  # broken: the resume would take step 10
    with pytest.raises(RecipeError, match=r"train\.lr 0\.01 -> 0\.02"):
        recipe_change.check(recipe("train.lr=0.02"), str(tmp_path))
    recipe_change.check(recipe("train.lr=0.01"), str(tmp_path))
    recipe_change.check(recipe("train.lr=0.5"), "s3://bucket/runs")  # remote: not read


def test_keys_known_to_one_side_only_are_not_compared() -> None:
    saved = {"train": {"lr": 0.1, "old_key": 1}, "workload": {"kind": "cnn"}}
    current = {"train": {"lr": 0.1, "new_key": 2}, "workload": {"kind": "cnn"}}
    assert recipe_change.changes(saved, current) == {}
    current["workload"] = {"kind": "sbi"}
    assert recipe_change.changes(saved, current) == {"workload.kind": ("cnn", "sbi")}


def test_epochs_null_extends_a_run_and_a_number_after_it_shortens_one(tmp_path: Path) -> None:
    """train.epochs: null trains until early stopping: no limit, the longest run there is."""
    stopping = ("train.early_stopping_patience=3", "train.schedule=constant")
    checkpointed(tmp_path / "bounded", 10, *stopping, "train.epochs=4")
    recipe_change.check(recipe(*stopping, "train.epochs=null"), str(tmp_path / "bounded"))
    checkpointed(tmp_path / "unbounded", 10, *stopping, "train.epochs=null")
    with pytest.raises(RecipeError, match=r"train\.epochs None -> 4"):
        recipe_change.check(recipe(*stopping, "train.epochs=4"), str(tmp_path / "unbounded"))


def test_the_checkpoint_the_command_verified_is_not_hashed_again(tmp_path: Path) -> None:
    """The command verifies the run's checkpoints once (``check_resumable``, every file's
    sha256) and compares the recipe of the one it found: its state file, changed after that
    check, is not read again (a second search would hash it, fail it and compare nothing)."""
    folder = checkpointed(tmp_path, 10)
    verified = checkpoint.check_resumable(tmp_path / "r")
    assert verified == folder
    state = folder / checkpoint.STATE_FILE
    data = bytearray(state.read_bytes())
    data[-1] ^= 0xFF  # same size, other bytes: only a new hash would notice
    state.write_bytes(bytes(data))
    with pytest.raises(RecipeError, match=r"train\.lr"):
        recipe_change.check(recipe("train.lr=0.01"), str(tmp_path), verified)
    recipe_change.check(recipe("train.lr=0.01"), str(tmp_path))  # searched anew: none valid
