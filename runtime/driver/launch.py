"""Driver side of ``trainforge train``: connect to Ray, check resources, open the MLflow run,
build the ``TorchTrainer`` and run it.

Every check that can fail because of the user's request happens here, before any worker
starts, and raises RecipeError.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainforge import config, log, ray_compat, storage
from trainforge.config import Recipe
from trainforge.config.resolve import worker_resources
from trainforge.driver import (
    collective_timeout,
    console,
    disk_full,
    local_cluster,
    out_of_memory,
    recipe_change,
)
from trainforge.driver.cluster import connect, storage_root
from trainforge.driver.run_lock import one_at_a_time
from trainforge.errors import NonFiniteLoss, RecipeError
from trainforge.log import first_line
from trainforge.tracking import driver as tracking
from trainforge.tracking.client import redact
from trainforge.worker import faults


def spool_file(cfg: Recipe, storage_path: str) -> Path:
    """Where tracking records wait when MLflow is unreachable: beside the checkpoints when the
    storage is a local/NFS path, else in the working directory."""
    from trainforge.tracking.spool import spool_path

    base = storage.local_folder(storage_path) or Path("trainforge-spool").resolve()
    return spool_path(base / cfg.run.name)


def check_existing_run(cfg: Recipe, storage_path: str) -> None:
    folder = storage.local_folder(storage_path)
    if folder is None:
        return
    run_dir = folder / cfg.run.name
    if run_dir.exists() and not cfg.checkpoint.resume:
        raise RecipeError(
            f"run.name: a run named {cfg.run.name!r} exists at {run_dir} and checkpoint.resume is "
            "false; pick another run.name or set checkpoint.resume=true"
        )
    from trainforge.checkpoint import check_resumable  # torch: only once a run is launched

    check_resumable(run_dir)  # checkpoints that all fail verification: refused, none deleted


@dataclass
class Outcome:
    """What `trainforge train` ends with: exit status, final metrics, latest checkpoint."""

    exit_code: int
    metrics: dict[str, Any] = field(default_factory=dict)
    checkpoint_path: str | None = None
    mlflow_run_id: str | None = None
    backend: str = ""
    """The process group's backend, as the workers reported it (nccl, gloo)."""
    num_workers: int = 0
    """The process group's world size, as the workers reported it."""
    recipe: Recipe | None = None
    """The resolved recipe the run trained (worker count, device, data paths filled in)."""


@one_at_a_time  # a second command with the same run.name refuses
def train(cfg: Recipe) -> Outcome:
    """Run the recipe to completion."""
    import ray
    import ray.train
    from ray.train.torch import TorchConfig

    _Trainer = ray_compat.trainer_class()

    from trainforge.workloads import check_workload_data

    check_workload_data(cfg.workload)
    root = storage_root(cfg.run)
    check_existing_run(cfg, root)
    connect()
    # From here on the run uses the resolved recipe: workers, MLflow and checkpoints see the
    # worker count, device and data paths that were decided, not "auto".
    cfg = config.resolve(cfg, ray.cluster_resources(), root)
    recipe_change.check(cfg, root)  # resuming with another recipe: refused, or said
    use_gpu = cfg.scaling.use_gpu == "true"

    recipe = config.to_container(cfg)
    recipe_yaml = config.to_yaml(cfg)
    payload: dict[str, Any] = {"recipe": recipe, "run_dir": f"{root}/{cfg.run.name}"}
    payload |= faults.requested()  # TRAINFORGE_FAIL_AFTER_EPOCH and the like, for tests
    payload["command"] = os.urandom(8).hex()  # its restarts are counted (worker/restarts.py)
    handle = None
    if cfg.tracking.enabled:
        mlflow_started = time.time()
        handle = tracking.start_run(
            cfg.tracking, cfg.run.name, recipe, recipe_yaml, str(spool_file(cfg, root))
        )
        payload["mlflow"] = handle.for_workers()
        if handle.run_id is not None:
            state = "reopened" if handle.resumed else "created"
            uri = redact(handle.tracking_uri)
            log.phase("mlflow", f"run {handle.run_id} {state} at {uri}", mlflow_started)

    payload["env"] = local_cluster.worker_env()  # this command's settings, on every worker
    ray_compat.time_out_report_barriers(cfg.scaling.timeout_s)  # like the process group's
    payload["workers_requested_at"] = time.time()  # the workers say how long they took
    trainer = _Trainer(
        train_loop_per_worker=_worker_entry,
        train_loop_config=payload,
        torch_config=TorchConfig(
            backend="nccl" if use_gpu else "gloo", timeout_s=cfg.scaling.timeout_s
        ),
        scaling_config=ray.train.ScalingConfig(
            num_workers=cfg.scaling.num_workers,
            use_gpu=use_gpu,
            resources_per_worker=worker_resources(cfg.scaling, use_gpu),
            placement_strategy=cfg.scaling.placement_strategy,
        ),
        # Ray Train V2's RunConfig takes logging_config; Ray's annotations name the V1 class.
        run_config=ray.train.RunConfig(  # type: ignore[call-arg]
            name=cfg.run.name,
            storage_path=root,
            failure_config=ray.train.FailureConfig(max_failures=cfg.run.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.checkpoint.keep_last),
            # Ray Train logs every report at INFO; our own progress lines say what matters.
            logging_config=ray.train.LoggingConfig(log_level="WARNING"),
        ),
    )
    status, checkpoint_path, reason = "FAILED", None, None
    worker_output = console.attach(storage.local_folder(root), cfg.run.name)
    try:
        result = trainer.fit()
        status = "FINISHED"
        checkpoint_path = result.checkpoint.path if result.checkpoint is not None else None
    except (KeyboardInterrupt, SystemExit, ray.train.TrainingFailedError) as exc:
        if trainer.interrupted or isinstance(exc, KeyboardInterrupt):
            status = "KILLED"
            log.say("interrupted; the run resumes from its last checkpoint when re-run")
            return Outcome(130, mlflow_run_id=handle.run_id if handle else None)
        if isinstance(exc, SystemExit):
            raise
        errors = ray_compat.worker_errors(exc)
        stopped = [e for e in errors if isinstance(e, NonFiniteLoss)]
        if stopped:  # the run's own verdict: one line, no traceback, nothing to resume
            reason = first_line(stopped[0], limit=1000)
            log.error(f"training stopped: {reason}")
            return Outcome(1, mlflow_run_id=handle.run_id if handle else None)
        reason = (
            out_of_memory.explain(exc, cfg)
            or collective_timeout.explain(exc, cfg)
            or disk_full.explain(exc, payload["run_dir"])
        )
        if reason is not None:  # one line with what to change, not the worker's traceback
            log.error(f"training failed: {reason}")
            return Outcome(1, mlflow_run_id=handle.run_id if handle else None)
        first = errors[0] if errors else exc
        reason = f"{type(first).__name__}: {first_line(first, limit=1000)}"
        log.error(f"training failed: {exc}")
        log.error(f"re-run with run.name={cfg.run.name} to resume")
        return Outcome(1, mlflow_run_id=handle.run_id if handle else None)
    finally:
        if worker_output is not None:
            worker_output.close()
        if handle is not None:
            tracking.finish_run(handle, status, checkpoint_path, reason)

    metrics = dict(result.metrics)
    # what the workers' process group was, as they reported it (worker/state.py's keys)
    backend = str(metrics.pop("worker/backend", ""))
    num_workers = int(metrics.pop("worker/world_size", 0))
    console.summary(
        cfg.run.name,
        metrics,
        checkpoint_path,
        (handle.run_id, handle.tracking_uri) if handle and handle.run_id else None,
    )
    return Outcome(
        0,
        metrics,
        checkpoint_path,
        handle.run_id if handle else None,
        backend=backend,
        num_workers=num_workers,
        recipe=cfg,
    )


def simulate(cfg: Recipe) -> int:
    """`trainforge simulate`: only the data stage (SBI simulations), on the Ray cluster."""
    from trainforge.workloads import check_workload_data, resolve_workload, spec_for

    if spec_for(cfg.workload.kind).prepare_data is None:
        raise RecipeError(f"workload.kind: {cfg.workload.kind} has no simulation stage (sbi has)")
    check_workload_data(cfg.workload)
    root = storage_root(cfg.run)
    storage.check_writable(root, cfg.run.name)  # the simulations are written under it
    connect()
    resolve_workload(cfg.workload, cfg.run.seed, root)  # says where the data are
    return 0


def _worker_entry(payload: dict[str, Any]) -> None:
    import ray.train

    local_cluster.apply_worker_env(payload.get("env", {}))

    context = ray.train.get_context()
    if context.get_world_rank() == 0 and "workers_requested_at" in payload:
        size = context.get_world_size()
        log.phase("workers", f"{size} started, process group up", payload["workers_requested_at"])
    # Imported in the worker so the driver does not pay for the loop's imports twice.
    from trainforge.worker.trainer import train_worker

    train_worker(payload)
