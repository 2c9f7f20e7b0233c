"""The tests' fault plugin (``tests/faults.py``, a worker plugin): an error or an out-of-memory
error raised by, or an endless wait in, the last rank's step at the step asked for (the error
not after a resume), an endless wait before the last rank's checkpoint report, a full disk while
rank 0 writes the checkpoint asked for, a failure after an epoch's checkpoint, and nothing
otherwise; the environment that asks for them."""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from tests import faults
from trainforge import checkpoint
from trainforge.checkpoint import FolderReporter, Position
from trainforge.distributed import WorkerContext


def trainer(rank: int, world_size: int) -> SimpleNamespace:
    ctx = WorkerContext(rank, rank, world_size, 0, torch.device("cpu"))
    step = lambda window, measure_norm=False: (torch.tensor(len(window)), None)  # noqa: E731
    return SimpleNamespace(ctx=ctx, step=step, state=SimpleNamespace(position=Position()))


def checkpointer(root: Path | None = None) -> SimpleNamespace:
    return SimpleNamespace(reporter=FolderReporter(root or Path("unused")),
                           write=checkpoint.save, maybe_save=lambda *a, **k: None)  # fmt: skip


@pytest.fixture
def inject(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """``inject(asked, trainer, checkpointer)``: the plugin installed, with the faults ``asked``
    (variable → value) in the environment as a command's workers have them."""

    def installed(asked: dict[str, int], trainer: object, holder: object) -> None:
        for name in faults.FAULTS:
            monkeypatch.delenv(name, raising=False)
        for name, value in asked.items():
            monkeypatch.setenv(name, str(value))
        faults.install(trainer, holder)

    return installed


def test_the_last_rank_runs_out_of_memory_at_the_step_asked_for(
    inject: Callable[..., None],
) -> None:
    first, last = trainer(0, 2), trainer(1, 2)
    for each in (first, last):
        inject({faults.OOM_AT_STEP: 3}, each, checkpointer())
    untouched = trainer(1, 2)
    inject({}, untouched, checkpointer())
    position = last.state.position
    for done in range(2):
        position.global_step = done
        assert last.step([1, 2])[0].item() == 2  # steps 1 and 2 run
    position.global_step = 2
    with pytest.raises(torch.OutOfMemoryError, match="injected at step 3"):
        last.step([1])
    first.state.position.global_step = untouched.state.position.global_step = 2
    assert first.step([1])[0].item() == untouched.step([1])[0].item() == 1


def test_the_last_rank_raises_at_the_step_asked_for_unless_its_attempt_resumed(
    inject: Callable[..., None],
) -> None:
    first, last, resumed = trainer(0, 2), trainer(1, 2), trainer(1, 2)
    resumed.state.position.global_step = 1  # a restart, from a checkpoint at step 1
    for each in (first, last, resumed):
        inject({faults.RAISE_AT_STEP: 3}, each, checkpointer())
    for each in (first, last, resumed):
        each.state.position.global_step = 1
        assert each.step([1, 2])[0].item() == 2  # step 2 runs
        each.state.position.global_step = 2
    with pytest.raises(RuntimeError, match="injected error at step 3"):
        last.step([1])
    assert first.step([1])[0].item() == resumed.step([1])[0].item() == 1


class Hung(Exception):
    """Stands in for the worker's endless sleep, which nothing but a kill ends."""


def sleeps_forever(slept: list[float]) -> Callable[[float], None]:
    def sleep(seconds: float) -> None:
        slept.append(seconds)
        if len(slept) == 3:  # it sleeps again and again: never returns to go on
            raise Hung

    return sleep


def test_the_last_rank_stops_responding_before_the_step_asked_for(
    inject: Callable[..., None],
) -> None:
    first, last = trainer(0, 2), trainer(1, 2)
    for each in (first, last):
        inject({faults.HANG_AT_STEP: 3}, each, checkpointer())
    assert isinstance(last.step, faults.HangAt) and not isinstance(first.step, faults.HangAt)
    slept: list[float] = []
    last.step.sleep = sleeps_forever(slept)
    position = last.state.position
    for done in range(2):
        position.global_step = done
        assert last.step([1, 2])[0].item() == 2  # steps 1 and 2 run
    assert slept == []
    position.global_step = 2
    with pytest.raises(Hung):
        last.step([1])
    assert slept == [3600, 3600, 3600]


def test_the_last_rank_never_reaches_the_report_of_the_step_asked_for(
    tmp_path: Path, inject: Callable[..., None]
) -> None:
    """Rank 0's reports go through; the last rank's reports before step 5 go through, the one
    at step 5 never happens."""
    first, last = trainer(0, 2), trainer(1, 2)
    first_saves, last_saves = checkpointer(tmp_path / "0"), checkpointer(tmp_path / "1")
    inject({faults.HANG_AT_REPORT: 5}, first, first_saves)
    inject({faults.HANG_AT_REPORT: 5}, last, last_saves)
    assert isinstance(first_saves.reporter, FolderReporter)
    hanging = last_saves.reporter
    assert isinstance(hanging, faults.HangAtReport)
    slept: list[float] = []
    hanging.sleep = sleeps_forever(slept)
    last.state.position.global_step = 4
    hanging.report({"train/loss": 1.0}, None)
    last.state.position.global_step = 5
    with pytest.raises(Hung):
        hanging.report({"train/loss": 0.5}, None)
    assert slept == [3600, 3600, 3600]
    assert hanging.reporter.reports == [{"train/loss": 1.0}]  # the report at step 4 only
    assert hanging.registered() is None  # no checkpoint folder was reported


def test_a_command_asks_for_faults_through_its_environment() -> None:
    env = faults.env({"PYTHONPATH": "/elsewhere"}, **{faults.OOM_AT_STEP: 30})
    assert env[faults.OOM_AT_STEP] == "30" and env[faults.PLUGINS] == "tests.faults"
    assert env["PYTHONPATH"].split(":") == [str(faults.ROOT), "/elsewhere"]  # found by workers


def test_every_rank_fails_after_the_checkpoint_of_the_epoch_asked_for(
    inject: Callable[..., None],
) -> None:
    saved: list[bool] = []
    holder = SimpleNamespace(maybe_save=lambda state, metrics, epoch_end=False, last=False:
                             saved.append(epoch_end))  # fmt: skip
    each = trainer(1, 2)
    inject({faults.FAIL_AFTER_EPOCH: 2}, each, holder)
    position = each.state.position
    position.epoch = 1
    holder.maybe_save(None, {}, epoch_end=True)  # epoch 1's checkpoint: on we go
    position.epoch = 2
    holder.maybe_save(None, {})  # a checkpoint within the epoch: on we go
    with pytest.raises(RuntimeError, match="injected failure after epoch 2"):
        holder.maybe_save(None, {}, epoch_end=True, last=False)
    assert saved == [True, False, True]  # the epoch's checkpoint was saved before


def test_rank_0_s_checkpoint_asked_for_meets_a_full_disk_and_leaves_no_part_of_it(
    tmp_path: Path, inject: Callable[..., None]
) -> None:
    writers = []
    for rank in (0, 1):
        holder = checkpointer(tmp_path)
        inject({faults.DISK_FULL_AT_CHECKPOINT: 2}, trainer(rank, 2), holder)
        writers.append(holder.write)
    write, other = writers
    assert other is checkpoint.save  # only rank 0 writes checkpoints
    folders = [tmp_path / f"checkpoint_{n}" for n in range(3)]
    for step, folder in enumerate(folders):
        folder.mkdir()
        state = {"global_step": step, "model": {"w": torch.full((3,), float(step))}}
        if step != 1:
            write(folder, state, "recipe\n")
            assert checkpoint.load(folder)["global_step"] == step  # whole and verified
            continue
        with pytest.raises(OSError) as full:
            write(folder, state, "recipe\n")
        assert full.value.errno == errno.ENOSPC
        assert full.value.filename == str(folder / checkpoint.STATE_FILE)
        assert list(folder.iterdir()) == []  # the part-written temporary file is gone
