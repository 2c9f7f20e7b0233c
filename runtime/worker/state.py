"""The train state, and when and how it is checkpointed.

``TrainState`` is everything a resumed run needs to continue bitwise where it stopped: the
model, the optimizer, the LR schedule, the GradScaler, early stopping and the position (epoch,
step within it, global step). The checkpoint adds every rank's RNG states (``rng``).

``Checkpointer.maybe_save`` owns the cadence (every ``every_steps`` steps, every
``every_epochs`` epochs, and the last), the barrier (a report is one: every rank calls
``maybe_save`` at the same points) and the MLflow commit (the metrics logged so far are covered
by the checkpoint, so a resumed run neither repeats nor skips a step's metrics). Metrics are
reported only with a checkpoint: once Ray's one-slot result queue is full, a report waits for
the controller's next poll, which would dominate short SBI epochs if every epoch reported.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainforge import checkpoint, log
from trainforge.checkpoint import Position, Reporter
from trainforge.config.schema import CheckpointSection
from trainforge.distributed import WorkerContext
from trainforge.early_stopping import EarlyStopping
from trainforge.optim import load_keeping_hyperparameters
from trainforge.precision import Precision
from trainforge.tracking.worker import WorkerTracker
from trainforge.worker.rng import gather_rng, resume_rng


@dataclass
class TrainState:
    """What a checkpoint saves and restores (``model`` is the bare module, not DDP's wrapper)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    precision: Precision
    stopper: EarlyStopping
    position: Position = field(default_factory=Position)

    def state_dict(self) -> dict[str, Any]:
        return {
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.precision.state_dict(),
            "epoch": self.position.epoch,
            "step_in_epoch": self.position.step_in_epoch,
            "global_step": self.position.global_step,
            "early_stopping": self.stopper.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        self.model.load_state_dict(state["model"])
        load_keeping_hyperparameters(self.scheduler, state["optimizer"], state["scheduler"])
        self.precision.load_state_dict(state["scaler"])
        position = self.position  # in place: the loop holds on to it
        position.epoch = int(state["epoch"])
        position.step_in_epoch = int(state["step_in_epoch"])
        position.global_step = int(state["global_step"])
        if "early_stopping" in state:  # absent from checkpoints older than early stopping
            self.stopper.load_state_dict(state["early_stopping"], device)

    def resume(self, saved: dict[str, Any] | None, ctx: WorkerContext) -> None:
        """Continue from a checkpoint (None: a fresh run), RNG streams included."""
        if saved is not None:
            self.load_state_dict(saved, ctx.device)
            resume_rng(saved["rng"], self.position.global_step, ctx)


BACKEND_KEY, WORLD_SIZE_KEY = "worker/backend", "worker/world_size"
"""Reported with every checkpoint; the driver's ``Outcome`` reads them from Ray's result."""


def process_group_report() -> dict[str, Any]:
    """The backend and size of the process group this worker trained in, as torch.distributed
    reports them ({} without one): what the run ran on, not what the recipe asked for."""
    if not (dist.is_available() and dist.is_initialized()):
        return {}
    return {BACKEND_KEY: str(dist.get_backend()), WORLD_SIZE_KEY: dist.get_world_size()}


class Checkpointer:
    """Saves the train state when due (``maybe_save``) and finds the run's latest (``latest``)."""

    def __init__(
        self,
        section: CheckpointSection,
        ctx: WorkerContext,
        recipe_yaml: str,
        reporter: Reporter,
        tracker: WorkerTracker,
    ) -> None:
        self.every_epochs = section.every_epochs
        self.every_steps = section.every_steps
        self.ctx = ctx
        self.recipe_yaml = recipe_yaml
        self.reporter = reporter
        self.tracker = tracker
        self.before_save: Callable[[], None] | None = None
        """Called on every rank when a save is due, before it (raises to refuse the save)."""
        self.write: Callable[[Path, dict[str, Any], str], None] = checkpoint.save
        """Writes a checkpoint's files into a folder (a test's fault may wrap it)."""
        self.process_group = process_group_report()

    def latest(self, run_dir: str | None) -> dict[str, Any] | None:
        """The state to resume from; rank 0 says in one line which broken checkpoints it
        passed over (every rank finds the same)."""
        found = checkpoint.latest(self.reporter, run_dir)
        warning = found.warning()
        if warning is not None and self.ctx.is_main:
            log.warn(warning)
        return found.state

    def due(self, position: Position, epoch_end: bool, last: bool) -> bool:
        if last:
            return True
        if epoch_end:  # position.epoch counts the epochs done
            return position.epoch % self.every_epochs == 0
        return self.every_steps is not None and position.global_step % self.every_steps == 0

    def maybe_save(
        self,
        state: TrainState,
        metrics: dict[str, float],
        epoch_end: bool = False,
        last: bool = False,
    ) -> bool:
        """After an optimizer step (``epoch_end`` False) or an epoch: save and report when due,
        or whenever ``last``. Returns whether it saved. Every rank calls this at the same points.

        The reported metrics carry ``epoch``: the epochs done when the checkpoint was taken,
        and the process group's backend and world size (``process_group_report``).
        """
        if not self.due(state.position, epoch_end, last):
            return False
        if self.before_save is not None:
            self.before_save()
        metrics = metrics | {"epoch": state.position.epoch} | self.process_group
        with self.tracker.committing():  # these metrics are covered by this checkpoint
            rng_states = gather_rng(self.ctx)  # a collective: before rank 0 goes its own way
            if self.ctx.is_main:
                with tempfile.TemporaryDirectory(prefix="trainforge-ckpt-") as folder:
                    saved = {**state.state_dict(), "rng": rng_states}
                    self.write(Path(folder), saved, self.recipe_yaml)
                    self.reporter.report(metrics, Path(folder))
            else:
                self.reporter.report(metrics, None)
        return True
