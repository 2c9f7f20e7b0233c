"""A worker that ran out of disk space, told in one line (``trainforge.driver.disk_full``): the
path, the rank and where a resume starts (the latest checkpoint that passes verification, by
real checkpoints on disk); None for any other failure."""

from __future__ import annotations

import errno
import os
from pathlib import Path

from ray.train import WorkerGroupError

from trainforge import checkpoint
from trainforge.driver import disk_full

NO_SPACE = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/tmp/trainforge-ckpt-x/state.pt")


def failed(failures: dict[int, Exception]) -> WorkerGroupError:
    return WorkerGroupError("Training failed due to worker errors", failures)


def test_a_full_disk_names_the_file_and_the_latest_valid_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    for name, step in (("checkpoint_a", 22), ("checkpoint_b", 44)):
        (run_dir / name).mkdir(parents=True)
        checkpoint.save(run_dir / name, {"global_step": step}, "recipe\n")
    (run_dir / "checkpoint_b" / checkpoint.MANIFEST_FILE).unlink()  # a copy cut short
    line = disk_full.explain(failed({1: ValueError("other"), 0: NO_SPACE}), str(run_dir))
    assert line == (
        "the disk is full: No space left on device writing /tmp/trainforge-ckpt-x/state.pt "
        "(rank 0); the latest valid checkpoint is checkpoint_a (step 22); free space there, "
        "then re-run the same command to resume"
    )


def test_without_a_path_or_a_checkpoint_it_names_the_run_folder(tmp_path: Path) -> None:
    # an OSError with the words but no errno or file name, as pyarrow's copies may raise
    copy = OSError("Error writing bytes to file. Detail: [errno 28] No space left on device")
    line = disk_full.explain(failed({0: copy}), str(tmp_path / "run"))
    assert line is not None
    assert line.startswith(f"the disk is full: No space left on device in {tmp_path / 'run'} ")
    assert "(rank 0); no checkpoint was saved before it;" in line


def test_other_failures_are_not_a_full_disk(tmp_path: Path) -> None:
    others = {0: OSError(errno.EIO, "Input/output error"), 1: RuntimeError("boom")}
    assert disk_full.explain(failed(others), str(tmp_path)) is None
    assert disk_full.explain(RuntimeError("not from the workers"), str(tmp_path)) is None
