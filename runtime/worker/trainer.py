"""The training loop every worker runs, on every worker path — ``run`` reads top to bottom:
setup → per epoch: train, end of epoch → finish.

Per optimizer step (``Stepper``): ``grad_accum_steps`` micro-batches, each forward+backward
under autocast, DDP's all-reduce skipped on all but the last (``no_sync``), the loss divided by
the number of micro-steps so the accumulated gradient is the mean; then unscale → clip → step
(or the whole step replayed as a CUDA graph) → LR schedule. Progress lines and MLflow metrics
every ``log_every_steps``. At epoch ends: validation (every ``eval_every_epochs`` and at the
end), early stopping, and a checkpoint when one is due (``Checkpointer.maybe_save``, also every
``checkpoint.every_steps``). Metrics are reported to Ray Train only with a checkpoint, and every
rank reaches every report: it is a barrier. At the end: the best weights back, the workload's
own evaluation and export on rank 0 (``finish``), and a final checkpoint when anything changed.
A loss or weights gone NaN/inf stop the run on every rank before they are logged or saved
(``health.py``).
"""

from __future__ import annotations

import importlib
import os
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from trainforge import config, distributed, stop_request
from trainforge.checkpoint import Reporter
from trainforge.config.schema import PrecisionSection, Recipe, TrainSection
from trainforge.data.sharding import TrainBatches, eval_batches, micro_batches_per_epoch, streams
from trainforge.data.types import Split, as_split
from trainforge.distributed import WorkerContext
from trainforge.early_stopping import EarlyStopping
from trainforge.optim import PlateauLR, build_optimizer, build_schedule
from trainforge.precision import Precision
from trainforge.profiling import StepProfiler
from trainforge.progress import Progress
from trainforge.tracking.client import redact_all
from trainforge.tracking.worker import WorkerTracker, handed_over
from trainforge.worker import restarts
from trainforge.worker.health import check_before_save, nonfinite_flags, raise_if_nonfinite
from trainforge.worker.payload import WorkerPayload
from trainforge.worker.rng import seed_everything
from trainforge.worker.state import Checkpointer, TrainState
from trainforge.worker.step import Stepper, cuda_graph_choice
from trainforge.workloads import build_workload
from trainforge.workloads.base import Workload


def run(payload: WorkerPayload, ctx: WorkerContext, reporter: Reporter) -> None:
    """One worker's whole run; ``reporter`` takes the checkpoints (Ray Train's, or the run
    folder's). Rank 0's final model goes to MLflow through the command where rank 0 relays
    (``tracking/relay.py``)."""
    cfg = config.from_container(payload.recipe)
    setup_backends(cfg.precision, ctx)
    seed_everything(cfg.run.seed + ctx.rank)  # per-rank streams for augmentation and dropout
    handle = handed_over(payload.mlflow, payload.handover_key, payload.relay_node, ctx,
                         cfg.tracking.system_metrics)  # fmt: skip
    tracker = WorkerTracker(handle, cfg.tracking, ctx)
    tracker.prewarm()  # MLflow's import and store, while the data and model are built
    recipe_yaml = redact_all(config.to_yaml(cfg))  # checkpoints keep no credentials
    checkpointer = Checkpointer(cfg.checkpoint, ctx, recipe_yaml, reporter, tracker)
    trainer = Trainer(cfg, ctx, tracker, resume_from=checkpointer.latest(payload.run_dir))
    checkpointer.before_save = trainer.check_finite  # never a checkpoint of a NaN run
    install_plugins(payload.plugins, trainer, checkpointer)
    state, plan = trainer.state, trainer.plan
    position = state.position
    restarts.record(payload.run_dir, payload.command, ctx, tracker, position.global_step)

    while (
        position.epoch < plan.epochs
        and position.global_step < plan.total_steps
        and not state.stopper.stopped
    ):
        trainer.train_epoch(checkpointer)  # saves every checkpoint.every_steps steps
        last = trainer.end_of_epoch(payload.run_dir)  # validation, early stopping, metrics
        checkpointer.maybe_save(state, trainer.metrics, epoch_end=True, last=last)

    # Whatever finish changed (best weights, the workload's evaluation) is reported with a
    # final checkpoint: Ray's result carries the metrics of the latest checkpoint, and a resume
    # must find the weights the run ended with. A barrier too: every rank waits here for rank
    # 0's evaluation.
    if trainer.finish(payload.run_dir):
        checkpointer.maybe_save(state, trainer.metrics, last=True)
    trainer.close()


def install_plugins(plugins: tuple[str, ...], trainer: Trainer, checkpointer: Checkpointer) -> None:
    """Each worker plugin's ``install(trainer, checkpointer)`` (``TRAINFORGE_WORKER_PLUGINS``),
    which may wrap the loop's parts: how the tests cause faults on a CPU."""
    for name in plugins:
        importlib.import_module(name).install(trainer, checkpointer)


# The plan of a run that early stopping ends (train.epochs: null): a bound never reached
UNBOUNDED_STEPS = 2**62


@dataclass(frozen=True)
class Plan:
    """How long the run is, in optimizer steps (``bounded`` False: until early stopping, with
    ``total_steps`` and ``epochs`` out of reach)."""

    global_batch: int
    steps_per_epoch: int
    total_steps: int
    epochs: int
    bounded: bool = True

    @classmethod
    def of(cls, train_cfg: TrainSection, train_samples: int, ctx: WorkerContext) -> Plan:
        global_batch = train_cfg.batch_size * ctx.world_size * train_cfg.grad_accum_steps
        micro_per_epoch = micro_batches_per_epoch(train_samples, ctx, train_cfg.batch_size)
        steps_per_epoch = micro_per_epoch // train_cfg.grad_accum_steps
        if steps_per_epoch == 0:
            raise ValueError(
                f"train.batch_size={train_cfg.batch_size} × grad_accum_steps="
                f"{train_cfg.grad_accum_steps} is larger than a worker's shard of "
                f"{train_samples} / {ctx.world_size} samples: no optimizer step fits in an epoch"
            )
        bounded = bool(train_cfg.max_steps) or train_cfg.epochs is not None
        if train_cfg.max_steps:
            total_steps = train_cfg.max_steps
        elif train_cfg.epochs is not None:
            total_steps = steps_per_epoch * train_cfg.epochs
        else:
            total_steps = UNBOUNDED_STEPS
        epochs = -(-total_steps // steps_per_epoch)
        return cls(global_batch, steps_per_epoch, total_steps, epochs, bounded)


class Trainer:
    """The parts of one worker's run (built in order: the RNG streams depend on it) and its
    stages, which ``run`` calls."""

    def __init__(
        self,
        cfg: Recipe,
        ctx: WorkerContext,
        tracker: WorkerTracker,
        resume_from: dict[str, Any] | None,
    ) -> None:
        self.cfg, self.ctx, self.tracker = cfg, ctx, tracker
        self.workload = build_workload(cfg.workload, seed=cfg.run.seed, precision=cfg.precision)
        # rank 0 fills an on-disk cache first, when loading can write one
        first = distributed.main_first(ctx) if self.workload.fills_cache else nullcontext()
        with first:
            train_split, val_split = self.workload.datasets(ctx.device)
        self.train_split = as_split(train_split, "training")
        self.val_split = as_split(val_split, "validation")
        self.plan = Plan.of(cfg.train, len(self.train_split), ctx)  # type: ignore[arg-type]
        # before the model: a DataLoader's worker processes start from a server that imports
        # meanwhile (``loader_processes``); making the loader draws no random numbers
        self.batches = TrainBatches(
            self.train_split,
            ctx,
            cfg.train.batch_size,
            seed=cfg.run.seed,
            loader_workers=self.workload.loader_workers,
            pin_memory=self.workload.pin_memory,
        )
        graphs, eager_why = cuda_graph_choice(cfg, ctx.device, streams(self.train_split))
        self.state = build_state(cfg, self.workload, self.plan, ctx, graphs)
        self.state.resume(resume_from, ctx)
        self.train_model = wrap(self.state.model, cfg.precision, ctx, graphs)
        tracker.start()
        tracker.log_training_data(self.workload.training_data())
        self.profiler = StepProfiler(
            cfg.tracking.profile_steps, cfg.tracking.profile_start_step, ctx
        )
        bounded = self.plan.bounded
        self.progress = Progress(
            ctx, self.plan.total_steps if bounded else None, self.plan.epochs if bounded else None,
            self.plan.global_batch, self.workload.describe(), self.state.stopper.patience > 0,
        )  # fmt: skip
        self.progress.start(self.state.position)
        if eager_why:
            self.progress.note(eager_why)
        self.step = Stepper(
            self.train_model, self.workload, self.state.precision, self.state.optimizer,
            cfg.train.clip_grad_norm, graphs, self.progress.note,
        )  # fmt: skip
        self.loss_sum = torch.zeros((), device=ctx.device)  # train loss since the last log line
        self.steps_since_log = 0
        # the epoch's logged steps (a resumed epoch counts from the resume)
        self.epoch_loss_sum = torch.zeros((), device=ctx.device)
        self.epoch_steps = 0
        self.metrics: dict[str, float] = {}  # the latest of each, reported with checkpoints
        self.eval_sums: dict[str, torch.Tensor] = {}  # the last validation's, for the figures

    def train_epoch(self, checkpointer: Checkpointer) -> None:
        """Optimizer steps from the position to the end of the epoch (or of the run)."""
        train_cfg, state, position = self.cfg.train, self.state, self.state.position
        accum = train_cfg.grad_accum_steps
        self.train_model.train()
        micro_batches = self.batches.epoch(
            position.epoch, skip_batches=position.step_in_epoch * accum
        )
        while (
            position.step_in_epoch < self.plan.steps_per_epoch
            and position.global_step < self.plan.total_steps
        ):
            window = [next(micro_batches) for _ in range(accum)]
            log_now = (position.global_step + 1) % train_cfg.log_every_steps == 0
            loss, grad_norm = self.step(window, measure_norm=log_now)
            state.scheduler.step()
            position.step_in_epoch += 1
            position.global_step += 1
            self.loss_sum += loss
            self.steps_since_log += 1
            self.profiler.after_step(position.global_step)
            if log_now:
                self.log_step(grad_norm)
            # Step metrics go to MLflow and the log, not to ray.train.report: a report waits
            # for the Ray Train controller's poll once its one-slot queue is full.
            checkpointer.maybe_save(state, self.metrics)
        # a generator: release a DataLoader epoch left part-way (max_steps)
        micro_batches.close()  # type: ignore[attr-defined]

    def log_step(self, grad_norm: torch.Tensor | None) -> None:
        """Training metrics since the last call: to MLflow and a progress line (one host sync)."""
        position = self.state.position
        metrics = train_metrics(
            self.loss_sum, self.steps_since_log, position.global_step, grad_norm,
            self.state.scheduler, self.ctx,
        )  # fmt: skip
        metrics.update(self.progress.step_metrics(position, self.steps_since_log))
        self.epoch_loss_sum += self.loss_sum
        self.epoch_steps += self.steps_since_log
        self.loss_sum.zero_()
        self.steps_since_log = 0
        self.tracker.log(metrics, position.global_step)
        self.progress.log_step(position, metrics)
        self.metrics = metrics

    def check_finite(self) -> None:
        """Before a checkpoint: stop if the loss or the weights turned non-finite."""
        check_before_save(
            self.loss_sum, self.state.model, self.ctx, self.state.position.global_step
        )

    def end_of_epoch(self, run_dir: str) -> bool:
        """Validation when due, early stopping, a stop request (``stop_request.py``), the
        epoch's metrics and line; moves the position to the next epoch. True when this epoch
        was the run's last."""
        position = self.state.position
        epoch = position.epoch
        asked = stop_request.read(run_dir) if self.ctx.is_main else None
        train_loss, stop_asked = self.epoch_train_loss(asked is not None)
        last = (
            stop_asked
            or position.global_step >= self.plan.total_steps
            or epoch + 1 >= self.plan.epochs
        )
        metrics: dict[str, float] = {"epoch": epoch + 1, "perf/elapsed_s": self.progress.elapsed()}
        metrics |= train_loss
        if last or (epoch + 1) % self.cfg.train.eval_every_epochs == 0:
            val_metrics = self.evaluate()
            metrics |= val_metrics
            self.lower_lr_on_plateau(val_metrics["val/loss"])
            last = self.early_stop(val_metrics["val/loss"], epoch + 1) or last  # a collective
        if stop_asked:  # kept in the checkpoint: a resumed run has ended too
            self.state.stopper.stopped = True
            metrics["run/stopped_on_request"] = 1.0
            self.progress.note(f"stopped after epoch {epoch + 1}: {asked}")  # rank 0's line
        if last:  # what this attempt cost, and how much of it was tracking on this thread
            metrics["perf/train_s"] = self.progress.elapsed()
            metrics["perf/tracking_s"] = self.tracker.busy_s
        self.tracker.log(metrics, position.global_step)
        self.metrics = self.metrics | metrics
        position.epoch, position.step_in_epoch = epoch + 1, 0
        self.progress.log_epoch(epoch, self.metrics)
        return last

    def epoch_train_loss(self, asked_to_stop: bool) -> tuple[dict[str, float], bool]:
        """The mean training loss over this epoch's steps and ranks, so the epoch's line does
        not repeat the last logging window's loss, and whether any rank was asked to stop: one
        collective for both."""
        steps = self.epoch_steps + self.steps_since_log
        total = self.epoch_loss_sum + self.loss_sum
        summed = distributed.all_reduce_sums(
            {"loss": total, "stop": float(asked_to_stop)}, self.ctx.device
        )
        self.epoch_loss_sum.zero_()
        self.epoch_steps = 0
        stop = bool(summed["stop"].item() > 0)
        if steps == 0:
            return {}, stop
        return {"train/epoch_loss": summed["loss"].item() / (steps * self.ctx.world_size)}, stop

    def evaluate(self) -> dict[str, float]:
        state = self.state
        metrics, self.eval_sums = evaluate(
            state.model, self.val_split, self.workload, state.precision, self.ctx, self.cfg.train
        )
        return metrics

    def lower_lr_on_plateau(self, val_loss: float) -> None:
        scheduler = self.state.scheduler
        if isinstance(scheduler, PlateauLR) and scheduler.evaluated(val_loss):
            lr = float(scheduler.get_last_lr()[0])
            self.progress.note(
                f"val/loss has not improved for {scheduler.patience} evaluations: learning "
                f"rate lowered to {lr:.3g}"
            )

    def early_stop(self, val_loss: float, epoch: int) -> bool:
        stopper = self.state.stopper
        if not stopper.update(val_loss, epoch, self.state.model, self.ctx):
            return False
        self.progress.note(
            f"early stop after epoch {epoch}: val/loss has not improved for "
            f"{stopper.patience} evaluations (best {stopper.best:.4f} at epoch "
            f"{stopper.best_epoch})"
        )
        return True

    def finish(self, run_dir: str | None) -> bool:
        """After the loop: the best weights back, the workload's own evaluation and export.
        True when anything changed since the last checkpoint."""
        position, stopper = self.state.position, self.state.stopper
        changed = not self.metrics  # a resumed run that had already finished: report once more
        if self.cfg.train.restore_best and stopper.restore_best(self.state.model):
            self.progress.note(
                f"restored the best weights (val/loss {stopper.best:.4f}, epoch "
                f"{stopper.best_epoch})"
            )
            changed = True
        if changed:  # the last training metrics stay; validation is of the weights kept
            val_metrics = self.evaluate()
            self.tracker.log(
                {f"final/{k}": v for k, v in val_metrics.items()}, position.global_step
            )
            self.metrics = self.metrics | val_metrics | {"epoch": position.epoch}
        self.progress.finish(position)
        self.profiler.stop()
        return self.workload_finish(run_dir) or changed

    def workload_finish(self, run_dir: str | None) -> bool:
        """The workload's own final evaluation and export, on rank 0; False when it has none."""
        finish = self.workload.finish
        if finish is None:
            return False
        if self.ctx.is_main:
            with tempfile.TemporaryDirectory(prefix="trainforge-eval-") as folder:
                model = distributed.unwrap(self.state.model)
                final, files = finish(model, run_dir, Path(folder))
                self.tracker.log(final, self.state.position.global_step)
                self.tracker.log_artifacts(files, "evaluation")
            self.metrics = self.metrics | final  # the workload said its outcome itself
        return True

    def close(self) -> None:
        if self.ctx.is_main:
            log_final_artifacts(
                self.tracker, self.workload, self.state.model, self.val_split, self.eval_sums,
                self.profiler,
            )  # fmt: skip
        self.tracker.close()


def build_state(
    cfg: Recipe, workload: Workload, plan: Plan, ctx: WorkerContext, graphs: bool = False
) -> TrainState:
    """A fresh train state: the model, optimizer (capturable for ``graphs``), LR schedule,
    precision and early stopping."""
    torch.manual_seed(cfg.run.seed)  # identical initial weights on every rank
    model = workload.build_model().to(ctx.device)
    if cfg.precision.channels_last:
        model = model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    lr = config.scaled_lr(cfg.train, plan.global_batch)
    optimizer = build_optimizer(model, cfg.train, lr, capturable=graphs)
    return TrainState(
        model=model,
        optimizer=optimizer,
        scheduler=build_schedule(optimizer, cfg.train, plan.total_steps),
        precision=Precision(cfg.precision.dtype, ctx.device),
        stopper=EarlyStopping(cfg.train.early_stopping_patience, cfg.train.restore_best),
    )


def wrap(
    model: nn.Module, precision_cfg: PrecisionSection, ctx: WorkerContext, graphs: bool = False
) -> nn.Module:
    """The module the steps run: over several ranks DDP, or for steps captured as CUDA graphs
    (``graphs``) an ``AveragedModule`` (``gradient_averaging.py``); compiled when asked."""
    train_model = distributed.wrap(model, ctx, graphs)
    if precision_cfg.compile:
        compiled = torch.compile(train_model, mode=precision_cfg.compile_mode)
        train_model = cast(nn.Module, compiled)
    return train_model


def log_final_artifacts(
    tracker: WorkerTracker,
    workload: Workload,
    model: nn.Module,
    val_split: Split,
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
    model = distributed.unwrap(model)
    with tracker.model_folder() as folder:
        custom = workload.mlflow_model(model, folder)  # the workload's own flavour
        if custom is not None:
            tracker.log_model(model, None, custom, workload.model_name)
            return
    batch = next(eval_batches(val_split, WorkerContext(0, 0, 1, 0, torch.device("cpu")), 2))
    example = workload.prepare_batch(batch, train=False)[0]  # the input example: its first tensor
    tracker.log_model(model, example, name=workload.model_name)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    split: Split,
    workload: Workload,
    precision: Precision,
    ctx: WorkerContext,
    train_cfg: TrainSection,
) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
    """Validation metrics over the whole split (each sample once across ranks), and the summed
    statistics they came from."""
    distributed.broadcast_buffers(model)  # every rank evaluates with rank 0's statistics
    model.eval()
    sums: dict[str, torch.Tensor | float] = {}
    batch_size = workload.eval_batch_size or max(train_cfg.batch_size, 256)
    for batch in eval_batches(split, ctx, batch_size=batch_size):
        with precision.autocast():
            stats = workload.eval_sums(model, workload.prepare_batch(batch, train=False))
        for key, value in stats.items():
            sums[key] = sums.get(key, 0) + value.detach().float()
    model.train()
    summed = distributed.all_reduce_sums(sums, ctx.device)
    return workload.summarize(summed), summed


def train_metrics(
    loss_sum: torch.Tensor,
    steps: int,
    step: int,
    grad_norm: torch.Tensor | None,
    scheduler: torch.optim.lr_scheduler.LRScheduler,
    ctx: WorkerContext,
) -> dict[str, float]:
    values: dict[str, torch.Tensor | float] = {"loss": loss_sum / steps}
    if grad_norm is not None:
        values["grad_norm"] = grad_norm
    values["nonfinite"] = nonfinite_flags(loss_sum, ctx)
    summed = distributed.all_reduce_sums(values, ctx.device)  # one collective, one host sync
    raise_if_nonfinite(summed.pop("nonfinite"), summed["loss"].item() / ctx.world_size, step)
    metrics = {f"train/{k}": v.item() / ctx.world_size for k, v in summed.items()}
    metrics["train/lr"] = float(scheduler.get_last_lr()[0])  # a tensor under cuda_graphs
    return metrics


def setup_backends(precision_cfg: PrecisionSection, ctx: WorkerContext) -> None:
    torch.backends.cuda.matmul.allow_tf32 = precision_cfg.tf32
    torch.backends.cudnn.allow_tf32 = precision_cfg.tf32
    # cuDNN's autotuning: on one H200 the graphed ResNet-18 step ran 8% faster with it, and a
    # cold worker's first step paid ~1 s for it (bench/cudnn_first_step.py)
    torch.backends.cudnn.benchmark = precision_cfg.cudnn_benchmark
    if ctx.device.type == "cuda":
        torch.cuda.set_device(ctx.device)
    if os.environ.get("OMP_NUM_THREADS") is None and ctx.device.type == "cpu":
        torch.set_num_threads(1)
