"""The training loop every Ray Train worker runs — one loop, read it top to bottom.

Per optimizer step: ``grad_accum_steps`` micro-batches, each forward+backward under autocast,
DDP's all-reduce skipped on all but the last (``no_sync``), the loss divided by the number of
micro-steps so the accumulated gradient is the mean; then unscale → clip → step → LR schedule.
Progress and metrics every ``log_every_steps``; evaluation and checkpoints at epoch ends.
Every rank reaches every ``ray.train.report`` call (epoch ends and checkpoints): it is a barrier.
"""

from __future__ import annotations

import os
import random
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from trainforge import config, distributed
from trainforge.checkpoint import Checkpointer, Position, restore_rng
from trainforge.data.sharding import TrainBatches, eval_batches, micro_batches_per_epoch
from trainforge.distributed import WorkerContext
from trainforge.early_stopping import EarlyStopping
from trainforge.optim import build_optimizer, build_schedule
from trainforge.precision import Precision
from trainforge.profiling import StepProfiler
from trainforge.progress import Progress
from trainforge.tracking.worker import WorkerTracker
from trainforge.worker.step import GraphedStep, optimizer_step
from trainforge.workloads import build_workload
from trainforge.workloads.base import Workload


def train_worker(payload: dict[str, Any]) -> None:
    """Entry point of each Ray Train worker. ``payload`` comes from ``trainforge.driver.launch``."""
    run(payload, distributed.ray_context())


def run(payload: dict[str, Any], ctx: WorkerContext) -> None:
    cfg = config.from_container(payload["recipe"])
    train_cfg, precision_cfg = cfg.train, cfg.precision
    setup_backends(precision_cfg, ctx)
    seed_everything(cfg.run.seed + ctx.rank)  # per-rank streams for augmentation and dropout

    workload = build_workload(cfg.workload, seed=cfg.run.seed, precision=precision_cfg)
    with distributed.main_first(ctx):  # rank 0 fills any on-disk cache first
        train_split, val_split = workload.datasets(ctx.device)
    torch.manual_seed(cfg.run.seed)  # identical initial weights on every rank
    model = workload.build_model().to(ctx.device)
    if precision_cfg.channels_last:
        model = model.to(memory_format=torch.channels_last)
    global_batch = train_cfg.batch_size * ctx.world_size * train_cfg.grad_accum_steps
    optimizer = build_optimizer(
        model, train_cfg, config.scaled_lr(train_cfg, global_batch), precision_cfg.cuda_graphs
    )
    precision = Precision(precision_cfg.dtype, ctx.device)

    loader_workers = getattr(cfg.workload, "loader_workers", 0)
    batches = TrainBatches(
        train_split,
        ctx,
        train_cfg.batch_size,
        seed=cfg.run.seed,
        loader_workers=loader_workers,
        pin_memory=getattr(cfg.workload, "pin_memory", False),
    )
    micro_per_epoch = micro_batches_per_epoch(len(train_split), ctx, train_cfg.batch_size)
    steps_per_epoch = micro_per_epoch // train_cfg.grad_accum_steps
    if steps_per_epoch == 0:
        raise ValueError(
            f"train.batch_size={train_cfg.batch_size} × grad_accum_steps="
            f"{train_cfg.grad_accum_steps} is larger than a worker's shard of "
            f"{len(train_split)} / {ctx.world_size} samples: no optimizer step fits in an epoch"
        )
    total_steps = train_cfg.max_steps or steps_per_epoch * train_cfg.epochs
    epochs = -(-total_steps // steps_per_epoch)
    scheduler = build_schedule(optimizer, train_cfg, total_steps)

    checkpointer = Checkpointer(cfg.checkpoint, ctx, config.to_yaml(cfg))
    latest = checkpointer.latest(payload.get("run_dir"))
    position = restore(latest, model, optimizer, scheduler, precision, ctx)
    stopper = EarlyStopping(train_cfg.early_stopping_patience, train_cfg.restore_best)
    if latest is not None and "early_stopping" in latest:
        stopper.load_state_dict(latest["early_stopping"], ctx.device)
    train_model = distributed.wrap(model, ctx, precision_cfg.cuda_graphs)
    if precision_cfg.compile:
        train_model = torch.compile(train_model, mode=precision_cfg.compile_mode)

    tracker = WorkerTracker(payload.get("mlflow"), cfg.tracking, ctx)
    tracker.start()
    profiler = StepProfiler(cfg.tracking.profile_steps, cfg.tracking.profile_start_step, ctx)
    progress = Progress(
        ctx, total_steps, epochs, global_batch, workload.describe(), stopper.patience > 0
    )
    progress.start(position)
    fail_after_epoch = payload.get("fail_after_epoch")

    def state() -> dict[str, Any]:
        return {
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "scaler": precision.state_dict(),
            "epoch": position.epoch,
            "step_in_epoch": position.step_in_epoch,
            "global_step": position.global_step,
            "early_stopping": stopper.state_dict(),
        }

    graphed: GraphedStep | None = None  # captured at the first step (needs a real batch)
    loss_sum = torch.zeros((), device=ctx.device)
    steps_since_log = 0
    metrics: dict[str, float] = {}
    eval_sums: dict[str, torch.Tensor] = {}
    while position.epoch < epochs and position.global_step < total_steps and not stopper.stopped:
        epoch = position.epoch
        train_model.train()
        micro_batches = batches.epoch(
            epoch, skip_batches=position.step_in_epoch * train_cfg.grad_accum_steps
        )
        while position.step_in_epoch < steps_per_epoch and position.global_step < total_steps:
            window = [next(micro_batches) for _ in range(train_cfg.grad_accum_steps)]
            log_now = (position.global_step + 1) % train_cfg.log_every_steps == 0
            if precision_cfg.cuda_graphs and graphed is None:
                graphed = GraphedStep(
                    train_model, workload, optimizer, train_cfg.clip_grad_norm, window[0],
                    precision.autocast,
                )  # fmt: skip
                if not graphed.captured:
                    progress.note(f"CUDA graph capture failed, eager steps: {graphed.error}")
            if graphed is not None and graphed.captured:
                loss, grad_norm = graphed(*window[0])
            else:
                loss, grad_norm = optimizer_step(
                    train_model, window, workload, precision, optimizer,
                    train_cfg.clip_grad_norm, measure_norm=log_now,
                )  # fmt: skip
            scheduler.step()
            position.step_in_epoch += 1
            position.global_step += 1
            loss_sum += loss
            steps_since_log += 1
            profiler.after_step(position.global_step)

            if log_now:
                metrics = train_metrics(loss_sum, steps_since_log, grad_norm, scheduler, ctx)
                metrics.update(progress.step_metrics(position, steps_since_log))
                loss_sum.zero_()
                steps_since_log = 0
                tracker.log(metrics, position.global_step)
                progress.log_step(position, metrics)
            # Step metrics go to MLflow and the log, not to ray.train.report: a report waits
            # for the Ray Train controller's poll once its one-slot queue is full.
            if checkpointer.due_after_step(position.global_step):
                with tracker.committing():  # these metrics are covered by this checkpoint
                    checkpointer.report(metrics | {"epoch": epoch}, state)

        micro_batches.close()  # release a DataLoader epoch left part-way (max_steps)
        last = position.global_step >= total_steps or epoch + 1 >= epochs
        epoch_metrics: dict[str, float] = {"epoch": epoch + 1, "perf/elapsed_s": progress.elapsed()}
        evaluated = last or (epoch + 1) % train_cfg.eval_every_epochs == 0
        if evaluated:
            val_metrics, eval_sums = evaluate(model, val_split, workload, precision, ctx, train_cfg)
            epoch_metrics |= val_metrics
            if stopper.update(val_metrics["val/loss"], epoch + 1, model, ctx):
                last = True
                progress.note(
                    f"early stop after epoch {epoch + 1}: val/loss has not improved for "
                    f"{stopper.patience} evaluations (best {stopper.best:.4f} at epoch "
                    f"{stopper.best_epoch})"
                )
        if last:  # what this attempt cost, and how much of it was tracking on this thread
            epoch_metrics["perf/train_s"] = progress.elapsed()
            epoch_metrics["perf/tracking_s"] = tracker.busy_s
        tracker.log(epoch_metrics, position.global_step)
        metrics = metrics | epoch_metrics
        position.epoch, position.step_in_epoch = epoch + 1, 0
        progress.log_epoch(epoch, metrics)
        save = checkpointer.due_after_epoch(epoch, last)
        # Only with a checkpoint: a report is a barrier and, once Ray's one-slot queue is full,
        # waits for the controller's poll, which would dominate short SBI epochs.
        if save:
            with tracker.committing():
                checkpointer.report(metrics, state)
        if fail_after_epoch is not None and epoch + 1 == fail_after_epoch:
            raise RuntimeError(
                f"injected failure after epoch {epoch + 1} (TRAINFORGE_FAIL_AFTER_EPOCH)"
            )

    # After the loop: best weights back, the workload's own evaluation and export. Whatever
    # changed is reported with a final checkpoint: Ray's result carries the metrics of the
    # latest checkpoint, and a resume must find the weights the run ended with.
    changed = not metrics  # a resumed run that had already finished: report once more
    if train_cfg.restore_best and stopper.restore_best(model):
        progress.note(f"restored the best weights (val/loss {stopper.best:.4f}, epoch "
                      f"{stopper.best_epoch})")  # fmt: skip
        changed = True
    if changed:  # the last training metrics stay; validation is of the weights kept
        val_metrics, eval_sums = evaluate(model, val_split, workload, precision, ctx, train_cfg)
        tracker.log({f"final/{k}": v for k, v in val_metrics.items()}, position.global_step)
        metrics = metrics | val_metrics | {"epoch": position.epoch}
    progress.finish(position)
    profiler.stop()
    finish = getattr(workload, "finish", None)
    with tempfile.TemporaryDirectory(prefix="trainforge-eval-") as folder:
        if finish is not None:  # workload-specific final evaluation and export, on rank 0
            final: dict[str, float] = {}
            if ctx.is_main:
                final, files = finish(
                    distributed.unwrap(model), payload.get("run_dir"), Path(folder)
                )
                tracker.log(final, position.global_step)
                tracker.log_artifacts(files, "evaluation")
                progress.note("evaluation: " + ", ".join(f"{k} {v:.4f}" for k, v in final.items()))
            metrics, changed = metrics | final, True
        if changed:  # a barrier too: every rank waits here for rank 0's evaluation
            with tracker.committing():
                checkpointer.report(metrics, state)
    if ctx.is_main:
        log_final_artifacts(tracker, workload, model, val_split, eval_sums, profiler)
    tracker.close()


def log_final_artifacts(
    tracker: WorkerTracker,
    workload: Workload,
    model: nn.Module,
    val_split: Any,
    eval_sums: dict[str, torch.Tensor],
    profiler: StepProfiler,
) -> None:
    """Rank 0, at the end: the model, the workload's figures, the profiler trace."""
    if not tracker.logs_metrics:
        return
    with tempfile.TemporaryDirectory(prefix="trainforge-artifacts-") as folder:
        tracker.log_artifacts(workload.write_figures(eval_sums, Path(folder)), "plots")
    if profiler.trace is not None:
        tracker.log_artifacts([profiler.trace], "profiler")
    example, _ = next(eval_batches(val_split, WorkerContext(0, 0, 1, 0, torch.device("cpu")), 2))
    tracker.log_model(distributed.unwrap(model), workload.prepare_batch(example, train=False))


@torch.no_grad()
def evaluate(
    model: nn.Module,
    split: Any,
    workload: Workload,
    precision: Precision,
    ctx: WorkerContext,
    train_cfg: Any,
) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """Validation metrics over the whole split (each sample once across ranks), and the summed
    statistics they came from."""
    model.eval()
    sums: dict[str, torch.Tensor] = {}
    batch_size = getattr(workload, "eval_batch_size", None) or max(train_cfg.batch_size, 256)
    for inputs, targets in eval_batches(split, ctx, batch_size=batch_size):
        with precision.autocast():
            batch = workload.eval_sums(model, workload.prepare_batch(inputs, train=False), targets)
        for key, value in batch.items():
            sums[key] = sums.get(key, 0) + value.detach().float()
    model.train()
    summed = distributed.all_reduce_sums(sums, ctx.device)
    return workload.summarize(summed), summed


def train_metrics(
    loss_sum: torch.Tensor,
    steps: int,
    grad_norm: torch.Tensor | None,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    ctx: WorkerContext,
) -> dict[str, float]:
    values: dict[str, torch.Tensor | float] = {"loss": loss_sum / steps}
    if grad_norm is not None:
        values["grad_norm"] = grad_norm
    summed = distributed.all_reduce_sums(values, ctx.device)  # one collective, one host sync
    metrics = {f"train/{k}": v.item() / ctx.world_size for k, v in summed.items()}
    metrics["train/lr"] = float(scheduler.get_last_lr()[0])  # a tensor under cuda_graphs
    return metrics


def restore(
    state: dict[str, Any] | None,
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    precision: Precision,
    ctx: WorkerContext,
) -> Position:
    if state is None:
        return Position()
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scheduler.load_state_dict(state["scheduler"])
    precision.load_state_dict(state["scaler"])
    if not restore_rng(state["rng"], ctx):
        seed_everything(int(state["global_step"]) * 1000 + ctx.rank)
    return Position(state["epoch"], state["step_in_epoch"], state["global_step"])


def setup_backends(precision_cfg: Any, ctx: WorkerContext) -> None:
    torch.backends.cuda.matmul.allow_tf32 = precision_cfg.tf32
    torch.backends.cudnn.allow_tf32 = precision_cfg.tf32
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
        torch.backends.cudnn.benchmark = True
    if os.environ.get("OMP_NUM_THREADS") is None and ctx.device.type == "cpu":
        torch.set_num_threads(1)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
