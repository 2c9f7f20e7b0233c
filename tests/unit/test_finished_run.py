"""A finished run's command again (``trainforge.driver.finished_run``): its outcome said again,
no worker started, nothing written; a longer run, another recipe or a newer checkpoint take
the usual path."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from trainforge import checkpoint, config
from trainforge.driver import finished_run, launch

DIGITS = Path(__file__).resolve().parents[2] / "recipes" / "cnn" / "digits_simple_cnn.yaml"
SECRET_URI = "http://alice:s3cret@127.0.0.1:5000"


def recipe(root: Path, *overrides: str) -> config.Recipe:
    return config.load(
        DIGITS,
        ["run.name=r", f"run.storage_path={root}", "train.epochs=3",
         f"tracking.tracking_uri={SECRET_URI}", *overrides],
    )  # fmt: skip


def left(cfg: config.Recipe, newest: Path | None) -> dict[str, object] | None:
    """``nothing_left``'s verdict on run ``r`` of ``cfg`` whose newest checkpoint is ``newest``."""
    run_dir = Path(cfg.run.storage_path) / "r"
    return finished_run.nothing_left(run_dir, finished_run.requested(cfg), newest)


def finished(root: Path, cfg: config.Recipe, name: str = "checkpoint_000003") -> Path:
    """A run of ``cfg`` that finished with a real checkpoint ``name``, recorded as a command
    that finished it records it."""
    folder = root / "r" / name
    folder.mkdir(parents=True)
    checkpoint.save(folder, {"global_step": 3}, config.to_yaml(cfg))
    outcome = launch.Outcome(
        0, {"epoch": 3, "val/accuracy": 0.97, "perf/samples_per_s": 2500.0}, str(folder),
        "abc123", SECRET_URI,
    )  # fmt: skip
    finished_run.record(root / "r", finished_run.requested(cfg), outcome)
    return folder


def test_the_same_command_again_says_the_outcome_and_starts_no_worker(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = recipe(tmp_path)
    last = finished(tmp_path, cfg)
    before = sorted(p.name for p in (tmp_path / "r").iterdir())

    def workers_started(*args: object) -> launch.Outcome:
        raise AssertionError("the finished run's command started its run")

    monkeypatch.setattr(launch, "_train", workers_started)
    outcome = launch.train(recipe(tmp_path, "train.log_every_steps=7"))  # a free key changed

    assert outcome.exit_code == 0
    assert outcome.metrics["val/accuracy"] == 0.97
    assert outcome.checkpoint_path == str(last)
    assert outcome.mlflow_run_id == "abc123"
    out = capsys.readouterr().out
    assert "run 'r' finished earlier (" in out and "): nothing left to train" in out
    assert re.search(r"val/accuracy\s+0\.9700\n", out) and re.search(rf"checkpoint\s+{last}\n", out)
    assert "abc123 at http://***@127.0.0.1:5000" in out  # the record keeps no credentials
    assert "a larger train.epochs or train.max_steps trains it further" in out
    assert sorted(p.name for p in (tmp_path / "r").iterdir()) == before  # nothing written
    assert "s3cret" not in (tmp_path / "r" / finished_run.FILE).read_text()
    assert "alice" not in (tmp_path / "r" / finished_run.FILE).read_text()


@pytest.mark.parametrize(
    "change",
    [("train.epochs=5",), ("train.max_steps=20",), ("train.lr=0.01",), ("run.seed=7",)],
)
def test_a_longer_run_or_another_recipe_takes_the_usual_path(
    tmp_path: Path, change: tuple[str, ...]
) -> None:
    cfg = recipe(tmp_path)
    last = finished(tmp_path, cfg)
    assert left(cfg, last) is not None
    assert left(recipe(tmp_path, *change), last) is None


def test_a_newer_checkpoint_or_no_readable_record_takes_the_usual_path(tmp_path: Path) -> None:
    cfg = recipe(tmp_path)
    last = finished(tmp_path, cfg)
    newer = tmp_path / "r" / "checkpoint_000009"  # a later command trained on
    newer.mkdir()
    checkpoint.save(newer, {"global_step": 9}, config.to_yaml(cfg))
    assert checkpoint.newest_verified(tmp_path / "r") == newer
    assert left(cfg, newer) is None
    assert left(cfg, None) is None  # no valid checkpoint

    record = tmp_path / "r" / finished_run.FILE
    for broken in ("{", json.dumps({"checkpoint": last.name})):  # cut short; a key missing
        record.write_text(broken)
        assert left(cfg, last) is None


def test_a_run_that_failed_or_kept_no_checkpoint_is_not_recorded(tmp_path: Path) -> None:
    cfg = recipe(tmp_path)
    (tmp_path / "r").mkdir()
    finished_run.record(tmp_path / "r", finished_run.requested(cfg), launch.Outcome(0))
    assert not (tmp_path / "r" / finished_run.FILE).exists()


def test_a_record_that_cannot_be_written_is_a_warning_not_a_failed_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = recipe(tmp_path)
    run_dir = tmp_path / "r"
    (run_dir / finished_run.FILE).mkdir(parents=True)  # a folder in the way: rename fails
    finished_run.record(run_dir, finished_run.requested(cfg), launch.Outcome(0, {}, "c"))
    assert f"warning: could not write {run_dir / finished_run.FILE}" in capsys.readouterr().err
    assert not list(run_dir.glob(".*tmp"))  # nothing half-written left
