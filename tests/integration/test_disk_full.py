"""The disk fills up while a checkpoint is written, on 2 CPU workers of the shared Ray (digits,
22 steps an epoch, a checkpoint after each of 2 epochs). ``TRAINFORGE_ENOSPC_AT_CHECKPOINT=2``
makes rank 0's second checkpoint meet ENOSPC part-way through its state file (a tmpfs cannot be
mounted in the CI container; the error, the writer and its clean-up are the real ones).

The command ends with one line naming the file and the checkpoint a resume starts from, exit 1,
the MLflow run FAILED with that reason; nothing of the broken checkpoint is left (neither in the
run folder nor its temporary folder), the first checkpoint is still the latest valid one, and
the same command then resumes from it and finishes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests import faults
from tests.conftest import RECIPES
from trainforge import checkpoint
from trainforge.cli import main as cli_main
from trainforge.tracking.client import resolve_uri

pytestmark = [pytest.mark.ray, pytest.mark.slow]

DIGITS = RECIPES / "cnn" / "digits_simple_cnn.yaml"
STEPS_PER_EPOCH = 22  # 1437 training images over 2 workers, batch 32, the last partial dropped
COMMAND = ["train", str(DIGITS), "run.name=full", "scaling.num_workers=2", "train.epochs=2",
           "checkpoint.every_epochs=1", "tracking.system_metrics=false"]  # fmt: skip


def checkpoints(run_dir: Path) -> list[Path]:
    return sorted(f for f in run_dir.glob("checkpoint_*") if f.is_dir())


def test_a_full_disk_at_a_checkpoint_is_one_line_and_the_previous_one_resumes(
    ray_cluster, in_tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_dir = in_tmp / "runs" / "full"
    faults.ask(monkeypatch, **{faults.DISK_FULL_AT_CHECKPOINT: "2"})
    assert cli_main(COMMAND) == 1
    err = capsys.readouterr().err
    failed = [line for line in err.splitlines() if line.startswith("[trainforge] training")]
    (first,) = checkpoints(run_dir)  # the epoch-1 checkpoint, and nothing of the second
    assert len(failed) == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    said = re.fullmatch(
        r"\[trainforge\] training failed: the disk is full: No space left on device writing "
        r"(/\S+/trainforge-ckpt-\w+)/state\.pt \(rank 0\); the latest valid checkpoint is "
        rf"{first.name} \(step {STEPS_PER_EPOCH}\); free space there, then re-run the same "
        r"command to resume",
        failed[0],
    )
    assert said is not None, failed
    assert not Path(said[1]).exists()  # the temporary checkpoint folder went with the error
    assert checkpoint.newest_verified(run_dir) == first
    assert not [p for p in run_dir.rglob("*") if p.name.endswith(".tmp")]

    client = MlflowClient(tracking_uri=resolve_uri(None))
    experiment = client.get_experiment_by_name("trainforge").experiment_id
    (run,) = client.search_runs([experiment], "tags.`trainforge.run_name` = 'full'")
    assert run.info.status == "FAILED"
    assert run.data.tags["trainforge.failure"] in failed[0]

    monkeypatch.delenv(faults.DISK_FULL_AT_CHECKPOINT)  # space freed
    assert cli_main(COMMAND) == 0
    out = capsys.readouterr().out
    assert f"resuming at epoch 2 step {STEPS_PER_EPOCH};" in out, out[-3000:]
    assert f"finished at step {2 * STEPS_PER_EPOCH} " in out
    latest = checkpoint.newest_verified(run_dir)
    assert latest is not None and checkpoint.load(latest)["global_step"] == 2 * STEPS_PER_EPOCH
    (run,) = client.search_runs([experiment], "tags.`trainforge.run_name` = 'full'")
    assert run.info.status == "FINISHED"
    assert "trainforge.failure" not in run.data.tags  # the failed attempt's, dropped
    for key in run.data.metrics:  # one value per step, though epoch 2 was trained twice
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert len(steps) == len(set(steps)), (key, sorted(steps))
