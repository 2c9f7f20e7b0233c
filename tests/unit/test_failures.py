"""A failed run told in one line (``trainforge.driver.workers.failures``), from the failed
ranks' errors as every worker group hands them over: workers that gave up waiting for a stopped
rank (in a torch collective, gloo's timeout, or at a checkpoint report, Ray Train's barrier
timeout), a full disk (the path, the rank and where a resume starts, by real checkpoints on
disk), a worker out of memory, a worker whose process died; the run's own stop on NaN; anything
else with the worker's error. Each explanation says None for the failures that are not its."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest
import torch
from ray.train.v2._internal.exceptions import BroadcastCollectiveTimeoutError

from tests.conftest import RECIPES
from trainforge import checkpoint, config
from trainforge.driver.workers import failures
from trainforge.driver.workers.base import WorkersFailed, died, how_it_ended
from trainforge.errors import CollectiveFailed, NonFiniteLoss

DIGITS = RECIPES / "cnn" / "digits_simple_cnn.yaml"
# gloo's own message, as rank 0 raised it in tests/integration/test_kills.py
GLOO = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
    "waiting 5000ms for recv operation to complete"
)
WHY = (
    "that stopped responding (a deadlock, a stuck data loader, device or storage); all workers "
    "were stopped. If a worker is only slow at times (a long evaluation or checkpoint on one "
    "rank), raise scaling.timeout_s; the same command resumes from the last checkpoint"
)


def test_a_rank_that_timed_out_in_a_collective_is_one_line_naming_the_setting() -> None:
    cfg = config.load(DIGITS, ["scaling.timeout_s=5"])
    line = failures.timed_out({0: RuntimeError(GLOO)}, cfg)
    assert line == f"rank 0 waited scaling.timeout_s=5 s in a collective for a worker {WHY}"
    both = failures.timed_out({1: RuntimeError(GLOO), 0: RuntimeError(GLOO)}, cfg)
    assert both is not None and both.startswith("rank 0, 1 waited")


def test_a_rank_that_timed_out_at_a_report_names_the_rank_it_waited_for() -> None:
    cfg = config.load(DIGITS, ["scaling.timeout_s=10"])
    barrier = BroadcastCollectiveTimeoutError(10.05, missing_ranks=[2, 3], timeout_s=10.0)
    line = failures.timed_out({0: barrier, 1: barrier}, cfg)
    assert line == (
        "rank 0, 1 waited scaling.timeout_s=10 s at a checkpoint report (ray.train.report) for "
        f"rank 2, 3, a worker {WHY}"
    )


def test_other_failures_are_not_called_a_timeout() -> None:
    cfg = config.load(DIGITS, [])
    assert failures.timed_out({0: RuntimeError("shape mismatch")}, cfg) is None
    assert failures.timed_out({0: ValueError(GLOO)}, cfg) is None
    assert failures.timed_out({}, cfg) is None  # no worker failed


def test_an_incomplete_all_reduce_is_told_as_a_rank_that_stopped_responding() -> None:
    cfg = config.load(DIGITS, ["scaling.timeout_s=15"])
    incomplete = CollectiveFailed("the all-reduce of step 30 came back incomplete")
    line = failures.timed_out({0: incomplete}, cfg)
    assert line == f"rank 0 waited scaling.timeout_s=15 s in a collective for a worker {WHY}"


NO_SPACE = OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), "/tmp/trainforge-ckpt-x/state.pt")


def test_a_full_disk_names_the_file_and_the_latest_valid_checkpoint(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    for name, step in (("checkpoint_a", 22), ("checkpoint_b", 44)):
        (run_dir / name).mkdir(parents=True)
        checkpoint.save(run_dir / name, {"global_step": step}, "recipe\n")
    (run_dir / "checkpoint_b" / checkpoint.MANIFEST_FILE).unlink()  # a copy cut short
    line = failures.disk_full({1: ValueError("other"), 0: NO_SPACE}, str(run_dir))
    assert line == (
        "the disk is full: No space left on device writing /tmp/trainforge-ckpt-x/state.pt "
        "(rank 0); the latest valid checkpoint is checkpoint_a (step 22); free space there, "
        "then re-run the same command to resume"
    )


def test_without_a_path_or_a_checkpoint_it_names_the_run_folder(tmp_path: Path) -> None:
    # an OSError with the words but no errno or file name, as pyarrow's copies may raise
    copy = OSError("Error writing bytes to file. Detail: [errno 28] No space left on device")
    line = failures.disk_full({0: copy}, str(tmp_path / "run"))
    assert line is not None
    assert line.startswith(f"the disk is full: No space left on device in {tmp_path / 'run'} ")
    assert "(rank 0); no checkpoint was saved before it;" in line


def test_other_failures_are_not_a_full_disk(tmp_path: Path) -> None:
    others = {0: OSError(errno.EIO, "Input/output error"), 1: RuntimeError("boom")}
    assert failures.disk_full((others), str(tmp_path)) is None
    assert failures.disk_full({}, str(tmp_path)) is None


def test_a_worker_out_of_memory_says_what_each_worker_holds_and_what_to_change() -> None:
    cfg = config.load(DIGITS, ["scaling.num_workers=2", "train.batch_size=32"])
    line = failures.out_of_memory({1: torch.OutOfMemoryError("CUDA out of memory")}, cfg)
    assert line is not None and line.startswith("out of CPU memory on rank 1: each of 2 workers")
    assert "global batch 64" in line and "lower train.batch_size" in line
    assert "or use precision.dtype=bf16" in line  # the recipe is in fp32
    assert failures.out_of_memory({0: RuntimeError("boom")}, cfg) is None
    bf16 = config.load(DIGITS, ["precision.dtype=bf16"])
    line = failures.out_of_memory({0: torch.OutOfMemoryError("CUDA out of memory")}, bf16)
    assert line is not None and "dtype" not in line  # nothing to suggest that it has already


@pytest.mark.parametrize(
    ("overrides", "advice"),
    [
        ([], "a lower train.lr or train.clip_grad_norm (e.g. 1.0)"),
        (["train.clip_grad_norm=1.0"], "a lower train.lr"),
        (["precision.dtype=bf16"], "a lower train.lr, train.clip_grad_norm (e.g. 1.0) or "
                                   "precision.dtype=fp32"),
    ],
)  # fmt: skip
def test_a_diverged_run_is_advised_only_what_its_recipe_does_not_do_already(
    tmp_path: Path, overrides: list[str], advice: str
) -> None:
    cfg = config.load(DIGITS, overrides)
    nan = NonFiniteLoss("train/loss became nan by step 7 (rank 0); the run stops here")
    assert failures.said(WorkersFailed({0: nan}), cfg, str(tmp_path)).endswith(f". Try {advice}")


def test_a_worker_whose_process_died_is_named_before_the_peers_it_left_waiting() -> None:
    dead = died(0, 4242, how_it_ended(-9))
    line = failures.worker_died({1: RuntimeError("Connection reset by peer"), 0: dead})
    assert line == (
        "worker process 4242 (rank 0) was killed by SIGKILL (out of memory: the kernel's OOM "
        "killer; or a kill -9); the same command resumes from the last checkpoint"
    )
    assert failures.worker_died({1: RuntimeError("Connection reset by peer")}) is None


def test_a_failure_is_said_in_one_line_and_its_reason_kept_for_mlflow(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config.load(DIGITS, ["scaling.timeout_s=5"])
    nan = NonFiniteLoss("train/loss became nan by step 7 (rank 1); the run stops here")
    steadier = f"{nan}. Try a lower train.lr or train.clip_grad_norm (e.g. 1.0)"
    assert failures.said(WorkersFailed({1: nan}), cfg, str(tmp_path)) == steadier
    assert capsys.readouterr().err.strip() == f"[trainforge] training stopped: {steadier}"
    reason = failures.said(WorkersFailed({0: RuntimeError(GLOO)}), cfg, str(tmp_path))
    assert reason.startswith("rank 0 waited scaling.timeout_s=5 s in a collective")
    assert capsys.readouterr().err.count("\n") == 1  # one line
    other = failures.said(WorkersFailed({1: ValueError("shape mismatch")}), cfg, str(tmp_path))
    assert other == "ValueError: shape mismatch"
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "[trainforge] training failed: rank 1: ValueError: shape mismatch",
        f"[trainforge] re-run with run.name={cfg.run.name} to resume",
    ]
