"""Progress lines from rank 0: epoch, step, loss, throughput and ETA — plus perf metrics."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import torch

from trainforge import log
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
        facts = ", ".join(f"{k}={v}" for k, v in self.facts.items())
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
            f"{self.global_batch}{resumed if position.global_step else ''}; {facts}"
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
        if self.total_steps is None:
            where, eta = f"epoch {position.epoch + 1} step {position.global_step}", "early stop"
        else:
            remaining = (self.total_steps - position.global_step) * self.step_ms / 1000
            where = (
                f"epoch {position.epoch + 1}/{self.epochs} step "
                f"{position.global_step}/{self.total_steps}"
            )
            eta = f"{self.eta_prefix}{timedelta(seconds=round(remaining))}"
        self._print(
            f"{where} loss {metrics['train/loss']:.4f} lr {metrics['train/lr']:.2e} "
            f"{metrics['perf/samples_per_s']:,.0f} samples/s {self.step_ms:.1f} ms/step eta {eta}"
        )

    def log_epoch(self, epoch: int, metrics: dict[str, float]) -> None:
        # the epoch's mean training loss when there is one, not the last logging window's
        train_key = "train/epoch_loss" if "train/epoch_loss" in metrics else "train/loss"
        shown = {k: v for k, v in metrics.items() if k == train_key or k.startswith("val/")}
        text = " ".join(f"{k} {v:.4f}" for k, v in shown.items())
        of = f"/{self.epochs}" if self.epochs is not None else ""
        self._print(f"epoch {epoch + 1}{of} done: {text}")

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def finish(self, position: Position) -> None:
        elapsed = time.perf_counter() - self.started
        steps = position.global_step - self.first_step
        rate = f", {self.global_batch * steps / elapsed:,.0f} samples/s" if steps else ""
        self._print(f"finished at step {position.global_step} in {elapsed:.1f} s{rate}")

    def note(self, text: str) -> None:
        """A one-off line from rank 0 (early stopping, evaluation results)."""
        self._print(text)

    def _print(self, text: str) -> None:
        if self.ctx.is_main:
            log.say(text)
