"""Faults caused on purpose, so that tests produce on a CPU what happens on real hardware: a
worker plugin (``TRAINFORGE_WORKER_PLUGINS=tests.faults``) that every worker installs before
its loop, on every worker path, asked for by the ``trainforge train`` command's environment
(which its workers take on). Nothing here is part of trainforge: production code reads none of
these variables.

``env(...)`` gives a command's environment the variables that ask for faults, the plugin and
the path to import it from.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainforge.checkpoint import Position

ROOT = Path(__file__).resolve().parents[1]
FAIL_AFTER_EPOCH = "TRAINFORGE_TEST_FAIL_AFTER_EPOCH"
"""Every rank raises after this epoch's checkpoint."""
RAISE_AT_STEP = "TRAINFORGE_TEST_RAISE_AT_STEP"
"""The optimizer step (1-based) during which the last rank raises a ``RuntimeError``, in an
attempt that began at the run's first step: a restart resumes from a checkpoint and passes it."""
OOM_AT_STEP = "TRAINFORGE_TEST_OOM_AT_STEP"
"""The optimizer step (1-based) during which the last rank runs out of memory."""
HANG_AT_STEP = "TRAINFORGE_TEST_HANG_AT_STEP"
"""The optimizer step (1-based) before which the last rank stops responding."""
HANG_AT_REPORT = "TRAINFORGE_TEST_HANG_AT_REPORT"
"""The step whose checkpoint report the last rank never reaches."""
DISK_FULL_AT_CHECKPOINT = "TRAINFORGE_TEST_ENOSPC_AT_CHECKPOINT"
"""The checkpoint (1-based, counted per worker process) whose writing on rank 0 runs out of
disk space."""
SLOW_FROM_STEP = "TRAINFORGE_TEST_SLOW_FROM_STEP"
"""From this optimizer step (1-based) on, every step takes ``SLOW_STEP_S`` longer on every rank:
time for a fault from outside to land inside an epoch that would end within a second."""
SLOW_STEP_S = 0.05
FAULTS = (FAIL_AFTER_EPOCH, RAISE_AT_STEP, OOM_AT_STEP, HANG_AT_STEP, HANG_AT_REPORT,
          DISK_FULL_AT_CHECKPOINT, SLOW_FROM_STEP)  # fmt: skip
PLUGINS = "TRAINFORGE_WORKER_PLUGINS"


def env(base: dict[str, str] | None = None, **faults: int) -> dict[str, str]:
    """``base`` (default: this process's environment) with the faults asked for by their
    variables' names (``HANG_AT_STEP=5``), this plugin, and this checkout on the Python path
    (worker processes import the plugin)."""
    out = dict(os.environ if base is None else base)
    out.update({name: str(value) for name, value in faults.items()})
    out[PLUGINS] = __name__
    paths = [str(ROOT), *[p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]]
    out["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    return out


def ask(monkeypatch: Any, **faults: int) -> None:
    """The faults asked for (as ``env``) in this process's environment, for a command run in
    this process (its workers take the command's environment on); undone with the test."""
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(dict.fromkeys([str(ROOT), *paths])))
    monkeypatch.setenv(PLUGINS, __name__)
    for name, value in faults.items():
        monkeypatch.setenv(name, str(value))


def asked(name: str) -> int | None:
    value = os.environ.get(name)
    return int(value) if value else None


def install(trainer: Any, checkpointer: Any) -> None:
    """Wrap ``trainer.step`` (the ``Stepper``), ``checkpointer.reporter``,
    ``checkpointer.write`` and ``checkpointer.maybe_save`` with the faults asked for. A full
    disk happens where checkpoints are written, on rank 0; the others on the last rank, so that
    rank 0 (which logs and saves) sees the consequences."""
    position = trainer.state.position
    if asked(FAIL_AFTER_EPOCH) is not None:
        checkpointer.maybe_save = FailAfterEpoch(asked(FAIL_AFTER_EPOCH), checkpointer.maybe_save,
                                                 position)  # fmt: skip
    if asked(SLOW_FROM_STEP) is not None:
        trainer.step = SlowFrom(asked(SLOW_FROM_STEP), trainer.step, position)
    if asked(DISK_FULL_AT_CHECKPOINT) is not None and trainer.ctx.rank == 0:
        checkpointer.write = DiskFullAt(asked(DISK_FULL_AT_CHECKPOINT), checkpointer.write)
    if trainer.ctx.rank != trainer.ctx.world_size - 1:
        return
    if asked(RAISE_AT_STEP) is not None:
        trainer.step = RaiseAt(asked(RAISE_AT_STEP), trainer.step, position)
    if asked(OOM_AT_STEP) is not None:
        trainer.step = OutOfMemoryAt(asked(OOM_AT_STEP), trainer.step, position)
    if asked(HANG_AT_STEP) is not None:
        trainer.step = HangAt(asked(HANG_AT_STEP), trainer.step, position)
    if asked(HANG_AT_REPORT) is not None:
        checkpointer.reporter = HangAtReport(asked(HANG_AT_REPORT), checkpointer.reporter,
                                             position)  # fmt: skip


class FailAfterEpoch:
    """Every rank raises once this epoch's checkpoint is saved."""

    def __init__(self, epoch: Any, maybe_save: Any, position: Position) -> None:
        self.epoch, self.maybe_save, self.position = int(epoch), maybe_save, position

    def __call__(self, *args: Any, epoch_end: bool = False, **kwargs: Any) -> Any:
        saved = self.maybe_save(*args, epoch_end=epoch_end, **kwargs)
        if epoch_end and self.position.epoch == self.epoch:
            raise RuntimeError(f"injected failure after epoch {self.epoch} ({FAIL_AFTER_EPOCH})")
        return saved


class SlowFrom:
    """Steps that each take ``SLOW_STEP_S`` longer from one step on (the same computation)."""

    def __init__(self, from_step: int, step: Any, position: Position) -> None:
        self.from_step, self.step, self.position = from_step, step, position

    def __call__(self, window: list[Any], measure_norm: bool = False) -> Any:
        if self.position.global_step + 1 >= self.from_step:
            time.sleep(SLOW_STEP_S)
        return self.step(window, measure_norm=measure_norm)


class RaiseAt:
    """A step that raises an ordinary ``RuntimeError`` at one step, before any of its
    collectives (the other ranks wait for this one in the step's all-reduce), unless this
    attempt resumed from a checkpoint: the fault happens once, and a restart goes past it."""

    def __init__(self, at_step: int, step: Any, position: Position) -> None:
        self.at_step, self.step, self.position = at_step, step, position
        self.resumed = position.global_step > 0

    def __call__(self, window: list[Any], measure_norm: bool = False) -> Any:
        if self.position.global_step + 1 == self.at_step and not self.resumed:
            raise RuntimeError(f"injected error at step {self.at_step} ({RAISE_AT_STEP})")
        return self.step(window, measure_norm=measure_norm)


class OutOfMemoryAt:
    """A step that raises ``torch.OutOfMemoryError`` (what CUDA raises) at one step."""

    def __init__(self, at_step: int, step: Any, position: Position) -> None:
        self.at_step, self.step, self.position = at_step, step, position

    def __call__(self, window: list[Any], measure_norm: bool = False) -> Any:
        if self.position.global_step + 1 == self.at_step:
            import torch

            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 20.00 GiB (injected at step "
                f"{self.at_step} by {OOM_AT_STEP})"
            )
        return self.step(window, measure_norm=measure_norm)


class HangAt:
    """A step that never returns at one step, before any of its collectives: the other ranks
    wait for this one in the step's all-reduce until the process-group timeout
    (``scaling.timeout_s``) ends it. What a stuck data loader, a deadlock or a wedged device
    looks like from the other ranks."""

    def __init__(
        self, at_step: int, step: Any, position: Position, sleep: Any = time.sleep
    ) -> None:
        self.at_step, self.step, self.position, self.sleep = at_step, step, position, sleep

    def __call__(self, window: list[Any], measure_norm: bool = False) -> Any:
        if self.position.global_step + 1 == self.at_step:
            hang(self.sleep)
        return self.step(window, measure_norm=measure_norm)


class HangAtReport:
    """A reporter that never reaches one checkpoint's report: rank 0, which saved it, waits in
    Ray Train's report barrier (not a torch collective) until its timeout, which the driver
    sets to ``scaling.timeout_s`` too. What a rank stuck between two checkpoints' collectives
    looks like."""

    def __init__(
        self, at_step: int, reporter: Any, position: Position, sleep: Any = time.sleep
    ) -> None:
        self.at_step, self.reporter, self.position, self.sleep = at_step, reporter, position, sleep

    def report(self, metrics: dict[str, float], folder: Path | None) -> None:
        if self.position.global_step == self.at_step:
            hang(self.sleep)
        self.reporter.report(metrics, folder)

    def registered(self) -> dict[str, Any] | None:
        return self.reporter.registered()  # type: ignore[no-any-return]


class DiskFullAt:
    """A checkpoint writer whose N-th checkpoint meets a full disk part-way through its state
    file: some bytes reach the temporary file of the real atomic writer, then the write raises
    the ``OSError`` (ENOSPC) a full disk raises. The other checkpoints are written as usual."""

    def __init__(self, at: int, write: Any) -> None:
        self.at, self.write, self.count = at, write, 0

    def __call__(self, folder: Path, state: dict[str, Any], recipe_yaml: str) -> None:
        self.count += 1
        if self.count != self.at:
            self.write(folder, state, recipe_yaml)
            return
        from trainforge.atomic import replacing
        from trainforge.checkpoint import STATE_FILE

        target = folder / STATE_FILE
        with replacing(target) as temporary:
            temporary.write_bytes(b"\0" * 4096)  # as far as the disk had room for
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))


def hang(sleep: Any) -> None:
    """Sleep until killed: Ray Train ends the worker group once another rank gave up."""
    while True:
        sleep(3600)
