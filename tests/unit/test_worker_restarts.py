"""Restarts of one command's workers (``trainforge.worker.restarts``): counted per command id
in the run folder by rank 0, said and logged from the first restart on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from trainforge.config.schema import TrackingSection
from trainforge.distributed import WorkerContext
from trainforge.tracking import relay
from trainforge.tracking.client import RunHandle, after
from trainforge.tracking.worker import WorkerTracker
from trainforge.worker import restarts


def ctx(rank: int) -> WorkerContext:
    return WorkerContext(rank, rank, 2, 0, torch.device("cpu"))


def test_each_later_start_of_the_same_command_is_a_restart(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    tracker = WorkerTracker(None, TrackingSection(enabled=False), ctx(0))
    run_dir = str(tmp_path / "run")
    assert restarts.record(run_dir, "a", ctx(0), tracker, step=0) == 0
    assert capsys.readouterr().out == ""
    assert restarts.record(run_dir, "a", ctx(1), tracker, step=22) == 0  # only rank 0 counts
    assert restarts.record(run_dir, "a", ctx(0), tracker, step=22) == 1
    assert restarts.record(run_dir, "a", ctx(0), tracker, step=44) == 2
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "[trainforge] workers restarted (2 so far, run.max_failures), resuming"
    # the next command starts from zero; remote storage: nothing counted
    assert restarts.record(run_dir, "b", ctx(0), tracker, step=44) == 0
    assert restarts.record("s3://b/run", "a", ctx(0), tracker, step=0) == 0


def test_a_restart_is_committed_at_once_and_never_left_out_as_already_logged(
    tmp_path: Path,
) -> None:
    """The restart's row reaches the command's relay file with no checkpoint after it (a
    command killed before its next one still counts it), and a resumed run whose MLflow history
    already reaches the step resumed from keeps it where that step's results are left out."""
    relay_file = tmp_path / "run" / relay.RELAY_FILE
    handle = RunHandle("sqlite:///unused.db", "e", "r", None, False,
                       str(tmp_path / "spool.jsonl"), str(relay_file))  # fmt: skip
    tracker = WorkerTracker(handle.for_workers(), TrackingSection(), ctx(0))
    run_dir = str(tmp_path / "run")
    restarts.record(run_dir, "a", ctx(0), tracker, step=0)
    assert not relay_file.exists()
    restarts.record(run_dir, "a", ctx(0), tracker, step=22)
    [record] = [json.loads(line) for line in relay_file.read_text().splitlines()]
    [row] = record["metrics"]
    assert (row[0], row[1], row[3]) == ("run/restarts", 1.0, 22)
    result = ["train/loss", 0.5, row[2], 22]
    assert after([result, row], logged_through=30) == [row]
