"""The train state and its checkpointing (``trainforge.worker.state``): a state_dict round trip
through a checkpoint file, the save cadence, and what one save does (commit, report)."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

from trainforge import checkpoint
from trainforge.checkpoint import FolderReporter, Position
from trainforge.distributed import WorkerContext
from trainforge.early_stopping import EarlyStopping
from trainforge.optim import build_schedule
from trainforge.precision import Precision
from trainforge.worker.state import Checkpointer, TrainState

CPU = torch.device("cpu")
TRAIN = SimpleNamespace(schedule="cosine", warmup_steps=2, min_lr_ratio=0.0)


def ctx(rank: int = 0, world_size: int = 1) -> WorkerContext:
    return WorkerContext(rank=rank, local_rank=rank, world_size=world_size, node_rank=0, device=CPU)


def train_state(seed: int) -> TrainState:
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    return TrainState(
        model=model,
        optimizer=optimizer,
        scheduler=build_schedule(optimizer, TRAIN, total_steps=20),
        precision=Precision("fp16", CPU),
        stopper=EarlyStopping(patience=2, keep_best=True),
    )


def steps(state: TrainState, count: int) -> None:
    for _ in range(count):
        loss = state.model(torch.randn(4, 3)).pow(2).mean()
        state.precision.backward(loss)
        state.precision.step(state.optimizer, list(state.model.parameters()), 1.0, False)
        state.optimizer.zero_grad()
        state.scheduler.step()
        state.position.global_step += 1


class RecordingTracker:
    """Stands in for WorkerTracker: records when the commit opens and closes."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    @contextlib.contextmanager
    def committing(self) -> Iterator[None]:
        self.events.append("commit")
        yield
        self.events.append("confirmed")


class RecordingReporter(FolderReporter):
    def __init__(self, root: Path, events: list[str]) -> None:
        super().__init__(root)
        self.events = events

    def report(self, metrics: dict[str, float], folder: Path | None) -> None:
        self.events.append("report" if folder is None else "report+checkpoint")
        super().report(metrics, folder)


def checkpointer(
    root: Path, every_epochs: int = 1, every_steps: int | None = None, rank: int = 0
) -> tuple[Checkpointer, list[str]]:
    events: list[str] = []
    section = SimpleNamespace(every_epochs=every_epochs, every_steps=every_steps)
    saver = Checkpointer(
        section, ctx(rank, 2 if rank else 1), "recipe: x\n", RecordingReporter(root, events),
        RecordingTracker(events),  # type: ignore[arg-type]
    )  # fmt: skip
    return saver, events


def test_state_dict_round_trip_through_a_checkpoint(tmp_path: Path) -> None:
    trained = train_state(seed=0)
    steps(trained, 5)
    trained.position.epoch, trained.position.step_in_epoch = 1, 2
    trained.stopper.update(0.5, 1, trained.model, ctx())
    checkpoint.save(tmp_path, trained.state_dict(), "")
    saved = checkpoint.load(tmp_path)

    fresh = train_state(seed=1)
    position = fresh.position
    fresh.load_state_dict(saved, CPU)
    assert fresh.position is position  # updated in place: the loop holds on to it
    assert fresh.position == Position(1, 2, 5)
    for a, b in zip(trained.model.parameters(), fresh.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert fresh.scheduler.get_last_lr() == trained.scheduler.get_last_lr()
    assert fresh.precision.state_dict() == trained.precision.state_dict()
    assert fresh.stopper.best == 0.5 and fresh.stopper.best_weights is not None
    # and both continue identically
    torch.manual_seed(7)
    steps(trained, 3)
    torch.manual_seed(7)
    steps(fresh, 3)
    assert trained.state_dict()["optimizer"]["state"][0]["step"] == 8
    for a, b in zip(trained.model.parameters(), fresh.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_resume_restores_the_rng_streams(tmp_path: Path) -> None:
    saver, _ = checkpointer(tmp_path)
    state = train_state(seed=0)
    torch.manual_seed(3)
    random.seed(3)
    np.random.seed(3)
    saver.maybe_save(state, {}, last=True)
    expected = (torch.rand(3).tolist(), random.random(), np.random.rand())

    fresh = train_state(seed=1)
    fresh.resume(saver.latest(None), ctx())
    assert (torch.rand(3).tolist(), random.random(), np.random.rand()) == expected
    fresh.resume(None, ctx())  # a fresh run: nothing to restore
    assert fresh.position == Position(0, 0, 0)


@pytest.mark.parametrize(
    ("position", "epoch_end", "last", "due"),
    [
        (Position(0, 30, 30), False, False, True),  # every 30 steps
        (Position(0, 31, 31), False, False, False),
        (Position(1, 0, 44), True, False, False),  # every 2 epochs: not after the first
        (Position(2, 0, 88), True, False, True),
        (Position(1, 0, 44), True, True, True),  # the last epoch always
        (Position(3, 0, 132), False, True, True),  # the end of the run
    ],
)
def test_cadence(position: Position, epoch_end: bool, last: bool, due: bool) -> None:
    saver, _ = checkpointer(Path("unused"), every_epochs=2, every_steps=30)
    assert saver.due(position, epoch_end, last) is due


def test_no_step_checkpoints_unless_asked() -> None:
    saver, _ = checkpointer(Path("unused"), every_steps=None)
    assert not saver.due(Position(0, 30, 30), epoch_end=False, last=False)


def test_maybe_save_saves_when_due_inside_the_commit(tmp_path: Path) -> None:
    saver, events = checkpointer(tmp_path / "run", every_epochs=2)
    state = train_state(seed=0)
    state.position = Position(1, 0, 44)
    assert saver.maybe_save(state, {"val/loss": 1.0}, epoch_end=True) is False
    assert events == [] and not (tmp_path / "run").exists()

    state.position = Position(2, 0, 88)
    assert saver.maybe_save(state, {"val/loss": 0.5, "epoch": 2}, epoch_end=True) is True
    assert events == ["commit", "report+checkpoint", "confirmed"]
    assert saver.reporter.reports == [{"val/loss": 0.5, "epoch": 2}]  # type: ignore[attr-defined]
    saved = checkpoint.load(tmp_path / "run" / "checkpoint_000000")
    assert set(saved) == set(state.state_dict()) | {"rng"}
    assert (saved["epoch"], saved["global_step"]) == (2, 88)
    assert len(saved["rng"]) == 1  # one entry per rank


def test_maybe_save_reports_the_epochs_done(tmp_path: Path) -> None:
    saver, _ = checkpointer(tmp_path, every_steps=10)
    state = train_state(seed=0)
    state.position = Position(1, 6, 20)  # mid-epoch: one epoch done
    saver.maybe_save(state, {"train/loss": 0.3})
    assert saver.reporter.reports == [{"train/loss": 0.3, "epoch": 1}]  # type: ignore[attr-defined]


def test_reports_carry_the_process_group_the_worker_is_in(tmp_path: Path) -> None:
    """The backend and world size come from torch.distributed, not from the recipe: the driver's
    Outcome reads them from the result (without a process group there are none: above)."""
    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        saver, _ = checkpointer(tmp_path / "run")
        saver.maybe_save(train_state(seed=0), {"val/loss": 0.5}, last=True)
    finally:
        dist.destroy_process_group()
    assert saver.reporter.reports == [  # type: ignore[attr-defined]
        {"val/loss": 0.5, "epoch": 0, "worker/backend": "gloo", "worker/world_size": 1}
    ]


def test_other_ranks_report_without_a_checkpoint(tmp_path: Path) -> None:
    saver, events = checkpointer(tmp_path / "run", rank=1)
    saver.maybe_save(train_state(seed=0), {"epoch": 1}, last=True)
    assert events == ["commit", "report", "confirmed"]  # the barrier, reached by every rank
    assert not (tmp_path / "run").exists()
