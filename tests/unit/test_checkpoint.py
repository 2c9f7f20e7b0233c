"""Checkpoint files and where they go (``trainforge.checkpoint``): weights_only loading, the
newest checkpoint on disk, the latest of the reporter's and the disk's, the local reporter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from trainforge import checkpoint
from trainforge.checkpoint import FolderReporter


def state(global_step: int) -> dict[str, Any]:
    return {"model": {"w": torch.full((2,), float(global_step))}, "global_step": global_step}


def write(folder: Path, global_step: int) -> Path:
    folder.mkdir(parents=True)
    checkpoint.save(folder, state(global_step), "run:\n  name: x\n")
    return folder


class Registered:
    """A reporter whose backend hands back a given checkpoint state."""

    def __init__(self, registered: dict[str, Any] | None) -> None:
        self.state = registered

    def report(self, metrics: dict[str, float], folder: Path | None) -> None:
        raise AssertionError("not reported to")

    def registered(self) -> dict[str, Any] | None:
        return self.state


def test_save_and_load_with_weights_only(tmp_path: Path) -> None:
    write(tmp_path / "c", 7)
    loaded = torch.load(tmp_path / "c" / checkpoint.STATE_FILE, weights_only=True)
    assert loaded["global_step"] == 7
    assert torch.equal(checkpoint.load(tmp_path / "c")["model"]["w"], torch.full((2,), 7.0))
    assert (tmp_path / "c" / checkpoint.RECIPE_FILE).read_text() == "run:\n  name: x\n"


def test_newest_in_takes_the_most_steps_and_skips_broken_copies(tmp_path: Path) -> None:
    assert checkpoint.newest_in(tmp_path) is None
    write(tmp_path / "checkpoint_b", 30)
    write(tmp_path / "checkpoint_a", 44)
    write(tmp_path / "other", 99)  # not a checkpoint folder by Ray's naming
    broken = tmp_path / "checkpoint_c"
    broken.mkdir()
    (broken / checkpoint.STATE_FILE).write_bytes(b"cut short")
    newest = checkpoint.newest_in(tmp_path)
    assert newest is not None and newest["global_step"] == 44


def test_latest_is_the_further_of_the_registered_and_the_disk(tmp_path: Path) -> None:
    run_dir = str(tmp_path)
    assert checkpoint.latest(Registered(None), run_dir) is None
    write(tmp_path / "checkpoint_0", 44)
    # registered behind the disk: a worker died before the controller registered its report
    found = checkpoint.latest(Registered(state(30)), run_dir)
    assert found is not None and found["global_step"] == 44
    found = checkpoint.latest(Registered(state(60)), run_dir)
    assert found is not None and found["global_step"] == 60
    # remote storage is not scanned; no run folder, only the registered one
    assert checkpoint.latest(Registered(None), "s3://bucket/run") is None
    found = checkpoint.latest(Registered(state(30)), None)
    assert found is not None and found["global_step"] == 30


def test_folder_reporter_keeps_checkpoints_as_ray_names_them(tmp_path: Path) -> None:
    reporter = FolderReporter(tmp_path / "run")
    assert reporter.registered() is None
    (tmp_path / "run").mkdir()
    reporter.report({"epoch": 0}, None)
    assert reporter.registered() is None
    for step in (44, 88):
        reporter.report({"epoch": step // 44}, write(tmp_path / f"tmp{step}", step))
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "checkpoint_000000",
        "checkpoint_000001",
    ]
    assert reporter.reports == [{"epoch": 0}, {"epoch": 1}, {"epoch": 2}]
    registered = reporter.registered()
    assert registered is not None and registered["global_step"] == 88
