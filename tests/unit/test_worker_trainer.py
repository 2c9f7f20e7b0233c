"""The worker loop (``trainforge.worker.trainer.run``) in this process, without Ray: world size
1 on the CPU, the digits CNN recipe, checkpoints to a local folder (``FolderReporter``).

Three epochs of 44 steps, a checkpoint every 30 steps and at every epoch end (steps 30, 44, 60,
88, 90, 120, 132). A run that crashes — at an epoch end, or right after a mid-epoch checkpoint —
and is run again continues from its latest checkpoint and ends bitwise where the uninterrupted
run ends, with augmentation on so that the RNG streams matter.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch

from tests import faults
from trainforge import checkpoint, config, progress_events
from trainforge.checkpoint import FolderReporter
from trainforge.distributed import WorkerContext
from trainforge.errors import NonFiniteLoss
from trainforge.worker.payload import WorkerPayload
from trainforge.worker.trainer import run
from trainforge.workloads.cnn.models import build_model

DIGITS = Path(__file__).resolve().parents[2] / "recipes" / "cnn" / "digits_simple_cnn.yaml"
CTX = WorkerContext(rank=0, local_rank=0, world_size=1, node_rank=0, device=torch.device("cpu"))
COMMON = (
    "scaling.num_workers=1",
    "tracking.enabled=false",
    "train.epochs=3",
    "workload.augment=true",
    "checkpoint.every_steps=30",
)
SAVED_AT = [30, 44, 60, 88, 90, 120, 132]  # every 30 steps and at each epoch's end (44 steps)
STATE_KEYS = {"model", "optimizer", "scheduler", "scaler", "epoch", "step_in_epoch",
              "global_step", "early_stopping", "rng"}  # fmt: skip


def train(
    run_dir: Path,
    *overrides: str,
    reporter: FolderReporter | None = None,
    fail_after_epoch: int | None = None,
) -> FolderReporter:
    """The loop on the digits recipe; with ``fail_after_epoch``, the tests' fault plugin makes
    it fail once that epoch's checkpoint is saved."""
    cfg = config.load(DIGITS, [*COMMON, *overrides])
    reporter = reporter or FolderReporter(run_dir)
    fault = {} if fail_after_epoch is None else {faults.FAIL_AFTER_EPOCH: str(fail_after_epoch)}
    payload = WorkerPayload(config.to_container(cfg), str(run_dir), "test",
                            plugins=("tests.faults",) if fault else ())  # fmt: skip
    with mock.patch.dict(os.environ, fault):
        run(payload, CTX, reporter)
    return reporter


def saved(run_dir: Path) -> list[dict[str, Any]]:
    """The run's checkpoints in the order they were written."""
    return [checkpoint.load(folder) for folder in sorted(run_dir.glob("checkpoint_*"))]


def assert_identical(a: Any, b: Any, where: str = "state") -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for key in a:
            assert_identical(a[key], b[key], f"{where}/{key}")
    elif isinstance(a, list | tuple):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_identical(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


class CrashAfterCheckpoints(FolderReporter):
    """Dies right after its ``count``-th checkpoint is persisted, as a preempted worker would."""

    def __init__(self, root: Path, count: int) -> None:
        super().__init__(root)
        self.left = count

    def report(self, metrics: dict[str, float], folder: Path | None) -> None:
        super().report(metrics, folder)
        self.left -= folder is not None
        if self.left == 0:
            raise RuntimeError("preempted")


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, FolderReporter]:
    """The uninterrupted run the others are compared with."""
    run_dir = tmp_path_factory.mktemp("straight")
    return run_dir, train(run_dir)


def test_the_loop_learns_and_checkpoints(straight: tuple[Path, FolderReporter]) -> None:
    run_dir, reporter = straight
    states = saved(run_dir)
    assert [s["global_step"] for s in states] == SAVED_AT
    assert [(s["epoch"], s["step_in_epoch"]) for s in states][:2] == [(0, 30), (1, 0)]
    # metrics go out with checkpoints only: one report per checkpoint, no final one (nothing
    # changed after the last epoch), each carrying the epochs done
    assert len(reporter.reports) == len(SAVED_AT)
    assert [r["epoch"] for r in reporter.reports] == [0, 1, 1, 2, 2, 2, 3]
    epoch_ends = [r for r in reporter.reports if "val/loss" in r]
    assert len(epoch_ends) == 3
    assert epoch_ends[0]["val/loss"] > epoch_ends[1]["val/loss"] > epoch_ends[2]["val/loss"]
    assert epoch_ends[0]["train/loss"] > epoch_ends[2]["train/loss"]
    assert epoch_ends[2]["val/accuracy"] >= 0.7  # chance is 0.1
    assert "perf/train_s" in epoch_ends[2]

    # the README's promise: weights_only loading, and "model" a plain state dict
    latest = sorted(run_dir.glob("checkpoint_*"))[-1]
    state = torch.load(latest / checkpoint.STATE_FILE, map_location="cpu", weights_only=True)
    assert set(state) == STATE_KEYS
    assert (state["epoch"], state["step_in_epoch"], state["global_step"]) == (3, 0, 132)
    model = build_model("simple_cnn", state["model"]["features.0.weight"].shape[1], 10, 32)
    model.load_state_dict(state["model"])
    recipe = config.load(latest / checkpoint.RECIPE_FILE)
    assert recipe.train.epochs == 3 and recipe.checkpoint.every_steps == 30


def test_resume_after_a_crash_at_an_epoch_end_is_bitwise_identical(
    straight: tuple[Path, FolderReporter], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(RuntimeError, match="injected failure after epoch 1"):
        train(tmp_path, fail_after_epoch=1)
    assert [s["global_step"] for s in saved(tmp_path)] == [30, 44]
    capsys.readouterr()

    resumed = train(tmp_path)
    assert "resuming at epoch 2 step 44" in capsys.readouterr().out
    # it went on from step 44: the same checkpoints as the uninterrupted run, each identical
    assert [s["global_step"] for s in saved(tmp_path)] == SAVED_AT
    assert [r["epoch"] for r in resumed.reports] == [1, 2, 2, 2, 3]
    for got, expected in zip(saved(tmp_path), saved(straight[0]), strict=True):
        assert_identical(got, expected, f"step {expected['global_step']}")


def test_resume_mid_epoch_is_bitwise_identical(
    straight: tuple[Path, FolderReporter], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(RuntimeError, match="preempted"):
        train(tmp_path, reporter=CrashAfterCheckpoints(tmp_path, count=1))
    capsys.readouterr()

    train(tmp_path)
    assert "resuming at epoch 1 step 30" in capsys.readouterr().out
    assert [s["global_step"] for s in saved(tmp_path)] == SAVED_AT
    assert_identical(saved(tmp_path)[-1], saved(straight[0])[-1])


def test_a_corrupted_latest_checkpoint_falls_back_to_the_previous_one(
    straight: tuple[Path, FolderReporter], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The step-44 checkpoint is bit-flipped after the crash: the rerun says so in one line,
    resumes from step 30 and still ends where the uninterrupted run ends."""
    with pytest.raises(RuntimeError, match="injected failure after epoch 1"):
        train(tmp_path, fail_after_epoch=1)
    _, at_44 = sorted(tmp_path.glob("checkpoint_*"))
    state_file = at_44 / checkpoint.STATE_FILE
    data = bytearray(state_file.read_bytes())
    data[len(data) // 2] ^= 0x01
    state_file.write_bytes(bytes(data))
    capsys.readouterr()

    train(tmp_path)
    out, err = capsys.readouterr()
    warnings = [line for line in err.splitlines() if "failed verification" in line]
    assert len(warnings) == 1 and f"{at_44.name}/state.pt: sha256 differs" in warnings[0]
    assert "resuming at epoch 1 step 30" in out
    assert at_44.exists()  # left as it was, not deleted
    assert_identical(checkpoint.load(sorted(tmp_path.glob("checkpoint_*"))[-1]),
                     saved(straight[0])[-1])  # fmt: skip


def test_restore_best_ends_with_a_checkpoint_of_the_best_weights(tmp_path: Path) -> None:
    # a constant, high LR: validation loss does not fall every epoch
    reporter = train(
        tmp_path, "train.restore_best=true", "train.lr=0.01", "train.schedule=constant",
        "checkpoint.every_steps=null",
    )  # fmt: skip
    states = saved(tmp_path)
    assert [s["global_step"] for s in states] == [44, 88, 132, 132]  # epochs, then the final one
    epoch_ends, final = reporter.reports[:3], reporter.reports[3]
    best = min(epoch_ends, key=lambda r: r["val/loss"])
    assert final["val/loss"] == best["val/loss"]  # validation of the weights kept
    assert final["epoch"] == 3
    best_weights = states[-1]["early_stopping"]["best_weights"]
    assert_identical(states[-1]["model"], best_weights)


def test_a_loss_that_turns_nan_stops_the_run_and_keeps_only_finite_checkpoints(
    tmp_path: Path,
) -> None:
    """AdamW at lr 1e5 breaks the weights by step 10 while the loss there is still finite
    (seen here): the check before the step-10 checkpoint finds them, so none is saved."""
    stop = r"the weights became non-finite by step 10 \(rank 0\) while train/loss was finite"
    with pytest.raises(NonFiniteLoss, match=stop):
        train(tmp_path, "train.lr=1e5", "checkpoint.every_steps=5", "train.log_every_steps=10")
    states = saved(tmp_path)
    assert states, "the steps before the loss turned were checkpointed"
    for state in states:
        assert all(torch.isfinite(w).all() for w in state["model"].values())
    assert [state["global_step"] for state in states] == [5]


def test_the_epoch_line_carries_the_epochs_mean_train_loss(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reporter = train(tmp_path, "train.epochs=1", "train.log_every_steps=1")
    out = as_text(capsys.readouterr().out)
    losses = [float(value) for value in re.findall(r"step \d+/44 loss (\S+)", out)]
    assert len(losses) == 44
    epoch_end = next(r for r in reporter.reports if "val/loss" in r)
    mean = epoch_end["train/epoch_loss"]
    assert mean == pytest.approx(sum(losses) / len(losses), abs=1e-4)  # lines round to 1e-4
    assert mean != pytest.approx(losses[-1], abs=1e-2)  # not the last window's loss
    assert f"epoch 1/1 done: train/epoch_loss {mean:.4f} val/loss" in out


def test_a_plateau_schedule_lowers_the_lr_after_an_evaluation_without_a_new_best(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # an LR too high for Adam on digits: validation loss stalls from the third epoch (seen here)
    reporter = train(
        tmp_path, "train.lr=0.03", "train.schedule=plateau", "train.plateau_patience=1",
        "train.plateau_factor=0.5", "train.epochs=5", "checkpoint.every_steps=null",
        "train.log_every_steps=4",
    )  # fmt: skip
    epochs = [r for r in reporter.reports if "val/loss" in r]
    assert len(epochs) == 5
    best, expected = float("inf"), [0.03]  # the LR of each epoch's last steps
    for report in epochs[:-1]:
        improved = report["val/loss"] < best
        best = min(best, report["val/loss"])
        expected.append(expected[-1] * (1 if improved else 0.5))
    assert [r["train/lr"] for r in epochs] == pytest.approx(expected)
    assert expected[-1] < 0.03, "no evaluation failed to improve: nothing was tested"
    assert "val/loss has not improved for 1 evaluations: learning rate lowered to" in (
        capsys.readouterr().out
    )


def test_epochs_null_trains_until_early_stopping_ends_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the LR that stalls validation from the third epoch (the plateau test's): patience 1 ends it
    reporter = train(
        tmp_path, "train.epochs=null", "train.early_stopping_patience=1", "train.lr=0.03",
        "train.schedule=constant", "checkpoint.every_steps=null", "train.log_every_steps=20",
    )  # fmt: skip
    out = as_text(capsys.readouterr().out)
    epochs = [r for r in reporter.reports if "val/loss" in r]
    stopped = re.search(r"early stop after epoch (\d+)", out)
    assert stopped is not None, out
    assert 2 <= int(stopped[1]) == epochs[-1]["epoch"] <= 20
    assert "training until early stopping ends the run on 1 worker (cpu)" in out
    assert re.search(r"epoch 1 step 20 loss \S+ .* eta early stop\n", out)
    assert "[trainforge] epoch 1 done: " in out  # no "/<epochs>" to a run without one


def test_a_stop_request_ends_the_run_finished_at_its_epochs_end_and_on_resume(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from trainforge import stop_request

    stop_request.write(tmp_path, "asked by the test")
    reporter = train(tmp_path, "checkpoint.every_steps=null")
    out = as_text(capsys.readouterr().out)
    assert "stopped after epoch 1: asked by the test" in out
    assert [r["epoch"] for r in reporter.reports if "val/loss" in r] == [1]
    assert reporter.reports[-1]["run/stopped_on_request"] == 1.0
    (state,) = saved(tmp_path)  # the epoch's checkpoint, which the run ended with
    assert state["epoch"] == 1 and state["early_stopping"]["stopped"] is True
    (tmp_path / stop_request.FILE).unlink()
    train(tmp_path, "checkpoint.every_steps=null")  # the same run again trains no further
    assert {state["epoch"] for state in saved(tmp_path)} == {1}


def as_text(out: str) -> str:
    """Rank 0's output with its progress events as the plain lines they stand for."""
    return "".join(f"{progress_events.as_text(line)}\n" for line in out.splitlines())


@pytest.mark.parametrize("autotune", [True, False])
def test_the_recipe_decides_cudnn_autotuning(autotune: bool) -> None:
    """``precision.cudnn_benchmark`` (default on) is what the worker's backends take: cuDNN's
    autotuning bought 8% of graphed ResNet-18 throughput on one H200 for ~1 s of the first
    step (bench/results), a trade a short run may refuse."""
    from trainforge.worker.trainer import setup_backends

    default = config.load(DIGITS, []).precision
    assert default.cudnn_benchmark is True
    cfg = config.load(DIGITS, [f"precision.cudnn_benchmark={str(autotune).lower()}"])
    before = torch.backends.cudnn.benchmark
    torch.backends.cudnn.benchmark = not autotune
    try:
        setup_backends(cfg.precision, CTX)
        assert torch.backends.cudnn.benchmark is autotune
    finally:
        torch.backends.cudnn.benchmark = before


def test_a_lone_rank_trains_checkpoints_and_resumes_without_importing_torch_dynamo(
    tmp_path: Path,
) -> None:
    """One rank needs no DDP, and the optimizers skip torch's TorchDynamo decorators
    (``optim.WithoutDynamo``): a cold one-GPU worker starts without that import (3.5-5.3 s of a
    GPU host). A new process, as this one may have imported it for another test; a second run
    resumes from the first one's checkpoint, so loading state is covered too."""
    code = """
import sys
from pathlib import Path
import torch
from trainforge import config
from trainforge.checkpoint import FolderReporter
from trainforge.distributed import WorkerContext
from trainforge.worker.payload import WorkerPayload
from trainforge.worker.trainer import run
ctx = WorkerContext(rank=0, local_rank=0, world_size=1, node_rank=0, device=torch.device("cpu"))
run_dir = Path(sys.argv[2])
for epochs in (1, 2):
    cfg = config.load(sys.argv[1], ["scaling.num_workers=1", "tracking.enabled=false",
                                    f"train.epochs={epochs}", "workload.augment=true"])
    payload = WorkerPayload(config.to_container(cfg), str(run_dir), "test")
    run(payload, ctx, FolderReporter(run_dir))
print(len(list(run_dir.glob("checkpoint_*"))))
print(sorted(name for name in sys.modules if name.startswith("torch._dynamo")))
"""
    done = subprocess.run(
        [sys.executable, "-c", code, str(DIGITS), str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    checkpoints, imported = done.stdout.strip().splitlines()[-2:]
    assert int(checkpoints) >= 2 and "resuming" in done.stdout + done.stderr
    assert imported == "[]"
