"""Faults injected on purpose, so that tests produce on a CPU what happens on real hardware.

Each is asked for with an environment variable of the ``trainforge train`` command;
``requested`` (called by the driver) turns those into payload entries, ``inject`` (in every
worker) applies them. Nothing happens unless one is set.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # torch only in the workers: the driver imports this module too
    from trainforge.checkpoint import Position

FAIL_AFTER_EPOCH = "fail_after_epoch"
"""Payload key: every rank raises after this epoch's checkpoint (``trainer.run``)."""
OOM_AT_STEP = "oom_at_step"
"""Payload key: the optimizer step (1-based) during which the last rank runs out of memory."""
HANG_AT_STEP = "hang_at_step"
"""Payload key: the optimizer step (1-based) before which the last rank stops responding."""
HANG_AT_REPORT = "hang_at_report"
"""Payload key: the step whose checkpoint report the last rank never reaches."""
DISK_FULL_AT_CHECKPOINT = "disk_full_at_checkpoint"
"""Payload key: the checkpoint (1-based, counted per worker process) whose writing on rank 0
runs out of disk space."""

FAIL_AFTER_EPOCH_ENV = "TRAINFORGE_FAIL_AFTER_EPOCH"
OOM_AT_STEP_ENV = "TRAINFORGE_OOM_AT_STEP"
HANG_AT_STEP_ENV = "TRAINFORGE_HANG_AT_STEP"
HANG_AT_REPORT_ENV = "TRAINFORGE_HANG_AT_REPORT"
DISK_FULL_AT_CHECKPOINT_ENV = "TRAINFORGE_ENOSPC_AT_CHECKPOINT"
_PAYLOAD_KEYS = {
    FAIL_AFTER_EPOCH_ENV: FAIL_AFTER_EPOCH,
    OOM_AT_STEP_ENV: OOM_AT_STEP,
    HANG_AT_STEP_ENV: HANG_AT_STEP,
    HANG_AT_REPORT_ENV: HANG_AT_REPORT,
    DISK_FULL_AT_CHECKPOINT_ENV: DISK_FULL_AT_CHECKPOINT,
}


def requested(environ: Mapping[str, str] = os.environ) -> dict[str, int]:
    """The payload entries for the faults the environment asks for (none: empty)."""
    return {key: int(environ[name]) for name, key in _PAYLOAD_KEYS.items() if environ.get(name)}


def inject(payload: dict[str, Any], trainer: Any, checkpointer: Any) -> None:
    """Wrap ``trainer.step`` (the ``Stepper``), ``checkpointer.reporter`` and
    ``checkpointer.write`` with the faults ``payload`` asks for. A full disk happens where
    checkpoints are written, on rank 0; the others on the last rank, so that rank 0 (which logs
    and saves) sees the consequences."""
    if payload.get(DISK_FULL_AT_CHECKPOINT) is not None and trainer.ctx.rank == 0:
        at = int(payload[DISK_FULL_AT_CHECKPOINT])
        checkpointer.write = DiskFullAt(at, checkpointer.write)
    if trainer.ctx.rank != trainer.ctx.world_size - 1:
        return
    position = trainer.state.position
    if payload.get(OOM_AT_STEP) is not None:
        trainer.step = OutOfMemoryAt(int(payload[OOM_AT_STEP]), trainer.step, position)
    if payload.get(HANG_AT_STEP) is not None:
        trainer.step = HangAt(int(payload[HANG_AT_STEP]), trainer.step, position)
    if payload.get(HANG_AT_REPORT) is not None:
        at_step = int(payload[HANG_AT_REPORT])
        checkpointer.reporter = HangAtReport(at_step, checkpointer.reporter, position)


class OutOfMemoryAt:
    """A step that raises ``torch.OutOfMemoryError`` (what CUDA raises) at one step."""

    def __init__(self, at_step: int, step: Any, position: Position) -> None:
        self.at_step, self.step, self.position = at_step, step, position

    def __call__(self, window: list[Any], measure_norm: bool = False) -> Any:
        if self.position.global_step + 1 == self.at_step:
            import torch

            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 20.00 GiB (injected at step "
                f"{self.at_step} by TRAINFORGE_OOM_AT_STEP)"
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
