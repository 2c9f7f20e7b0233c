"""Progress from rank 0: the run's first line, step, epoch and finish events (drawn or printed
by the driver: ``progress_events.py``) with loss, throughput and ETA — plus perf metrics."""

from __future__ import annotations

import time
from typing import Any

import torch

from trainforge import log, progress_events
from trainforge.checkpoint import Position
from trainforge.distributed import WorkerContext


class Progress:
    def __init__(
        self,
        ctx: WorkerContext,
        total_steps: int | None,
        epochs: int | None,
        global_batch: int,
        facts: dict[str, Any],
        early_stopping: bool = False,
    ) -> None:
        self.ctx = ctx
        # total_steps and epochs None: the run goes on until early stopping ends it.
        # With early stopping, the planned steps are only an upper bound on the run
        self.eta_prefix = "≤ " if early_stopping else ""
        self.total_steps = total_steps
        self.epochs = epochs
        self.global_batch = global_batch
        self.facts = facts
        self.started = self.last = time.perf_counter()
        self.first_step = 0
        self.step_ms = 0.0

    def start(self, position: Position) -> None:
        self.started = self.last = time.perf_counter()
        self.first_step = position.global_step
        facts = "; " + ", ".join(f"{k}={v}" for k, v in self.facts.items()) if self.facts else ""
        resumed = f", resuming at epoch {position.epoch + 1} step {position.global_step}"
        length = (
            f"{log.counted(self.total_steps, 'step', 'steps')} over "
            f"{log.counted(self.epochs, 'epoch', 'epochs')}"
            if self.total_steps is not None and self.epochs is not None
            else "until early stopping ends the run"
        )
        self._print(
            f"training {length} on "
            f"{log.counted(self.ctx.world_size, 'worker', 'workers')} ({self.ctx.device.type}), "
            "global batch "
            f"{self.global_batch}{resumed if position.global_step else ''}{facts}"
        )

    def step_metrics(self, position: Position, steps: int) -> dict[str, float]:
        """Throughput since the previous call (the caller has already synchronised the device
        by reading the loss)."""
        now = time.perf_counter()
        elapsed = max(now - self.last, 1e-9)
        self.last = now
        self.step_ms = 1000 * elapsed / steps
        metrics = {
            "perf/step_ms": self.step_ms,
            "perf/samples_per_s": self.global_batch * steps / elapsed,
        }
        if self.ctx.device.type == "cuda":
            metrics["sys/gpu_mem_gb"] = torch.cuda.max_memory_allocated(self.ctx.device) / 1e9
        return metrics

    def log_step(self, position: Position, metrics: dict[str, float]) -> None:
        remaining = None
        if self.total_steps is not None:
            remaining = (self.total_steps - position.global_step) * self.step_ms / 1000
        self._emit(
            "step", epoch=position.epoch + 1, epochs=self.epochs, step=position.global_step,
            total=self.total_steps, loss=metrics["train/loss"], lr=metrics["train/lr"],
            samples_per_s=metrics["perf/samples_per_s"], step_ms=self.step_ms,
            eta_s=remaining, eta_bound=bool(self.eta_prefix),
        )  # fmt: skip

    def log_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        # the epoch's mean training loss when there is one, not the last logging window's
        train_key = "train/epoch_loss" if "train/epoch_loss" in metrics else "train/loss"
        shown = {k: v for k, v in metrics.items() if k == train_key or k.startswith("val/")}
        self._emit("epoch", epoch=epoch + 1, epochs=self.epochs, metrics=shown)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def finish(self, position: Position) -> None:
        """The run's last step (a logging step or not: a bar ends there) and its rate."""
        elapsed = time.perf_counter() - self.started
        steps = position.global_step - self.first_step
        self._emit(
            "finish", epoch=position.epoch, epochs=self.epochs, step=position.global_step,
            total=self.total_steps, seconds=elapsed,
            samples_per_s=self.global_batch * steps / elapsed if steps else None,
        )  # fmt: skip

    def note(self, text: str) -> None:
        """A one-off line from rank 0 (early stopping, evaluation results)."""
        self._print(text)

    def _print(self, text: str) -> None:
        if self.ctx.is_main:
            log.say(text)

    def _emit(self, kind: str, **fields: Any) -> None:
        if self.ctx.is_main:
            progress_events.emit(kind, **fields)
