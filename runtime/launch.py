"""Driver side of ``trainforge train``: connect to Ray, check resources, open the MLflow run,
build the ``TorchTrainer`` and run it.

Every check that can fail because of the user's request happens here, before any worker
starts, and raises RecipeError.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from runtime import config, tracking
from runtime.errors import RecipeError

FAIL_AFTER_EPOCH_ENV = "TRAINFORGE_FAIL_AFTER_EPOCH"  # fault injection, used by the resume tests


def connect(local_only: bool = False, **init_options: Any) -> None:
    """Join the cluster in RAY_ADDRESS (as under `ray job submit`), else start a local Ray.

    Every process of the job is given its own cluster's address (RAY_ADDRESS in the job's
    runtime env). Ray Train's placement-group cleaner, a detached actor, asks the State API
    whether the run's controller lives; without RAY_ADDRESS that API asks the cluster named in
    /tmp/ray/ray_current_cluster (the last `ray start` on the machine). Another live cluster
    there has no such controller, and the cleaner removes the run's placement group: a healthy
    run is killed. A dead one makes each query wait ~40 s for its GCS, and the end of every run
    waited 12 s for the cleaner to stop (measured on this project's CPU). A local Ray therefore
    gets a known GCS port.
    """
    import ray

    if ray.is_initialized():
        return
    options = {"log_to_driver": True, "dashboard_host": "127.0.0.1", **init_options}
    address = None if local_only else os.environ.get("RAY_ADDRESS")
    if address:
        _init_pinned(ray, address, address, options)
        return
    # "local": a new instance even when a `ray start` cluster runs on this machine (a bare
    # ray.init() would join that one). The local dashboard stays on loopback.
    port = os.environ.get(GCS_PORT_ENV) or str(_free_port())
    previous = os.environ.get(GCS_PORT_ENV)
    os.environ[GCS_PORT_ENV] = port  # read by Ray when it starts the local GCS
    try:
        _init_pinned(ray, "local", f"127.0.0.1:{port}", options)
    finally:
        if previous is None:
            del os.environ[GCS_PORT_ENV]


GCS_PORT_ENV = "RAY_GCS_SERVER_PORT"


def _init_pinned(ray: Any, address: str, own: str, options: dict[str, Any]) -> None:
    if own == "auto" or "://" in own:  # not a GCS address: nothing to pin
        ray.init(address=address, **options)
        return
    try:
        ray.init(address=address, runtime_env={"env_vars": {"RAY_ADDRESS": own}}, **options)
    except ValueError as exc:  # a submitted job's runtime env already sets RAY_ADDRESS
        if "merge" not in str(exc):
            raise
        ray.init(address=address, **options)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def worker_resources(scaling: Any, use_gpu: bool) -> dict[str, float]:
    resources = dict(scaling.resources_per_worker)
    resources.setdefault("CPU", 1)
    if use_gpu:
        resources.setdefault("GPU", 1)
    return resources


def check_resources(scaling: Any, available: dict[str, float], cuda_graphs: bool = False) -> bool:
    """Raise RecipeError when the cluster cannot host the workers; return whether to use GPUs.
    Resolves ``use_all_gpus`` into ``num_workers``."""
    gpus = available.get("GPU", 0)
    if scaling.use_all_gpus:
        if gpus < 1 or scaling.use_gpu == "false":
            raise RecipeError("scaling.use_all_gpus: true, but the Ray cluster has no GPU to use")
        per_worker = scaling.resources_per_worker.get("GPU", 1)
        if per_worker <= 0 or gpus < per_worker:
            raise RecipeError(
                f"scaling.use_all_gpus: each worker asks for {per_worker:g} GPU "
                f"(scaling.resources_per_worker.GPU) and the Ray cluster has {gpus:g}"
            )
        scaling.num_workers = int(gpus // per_worker)
    if scaling.use_gpu == "true" and gpus == 0:
        raise RecipeError("scaling.use_gpu: true, but the Ray cluster has no GPU")
    use_gpu = scaling.use_gpu == "true" or (scaling.use_gpu == "auto" and gpus > 0)
    if cuda_graphs and not use_gpu:
        raise RecipeError(
            "precision.cuda_graphs: needs GPU workers (CUDA graphs), and these would run on CPU"
        )
    for resource, amount in worker_resources(scaling, use_gpu).items():
        need, have = amount * scaling.num_workers, available.get(resource, 0)
        if need > have:
            raise RecipeError(
                f"scaling.num_workers: {scaling.num_workers} workers × {amount:g} {resource} "
                f"need {need:g} {resource}, but the Ray cluster has {have:g}"
            )
    return use_gpu


def storage_root(run: Any) -> str:
    """Absolute storage path (Ray workers run elsewhere); URIs such as s3:// pass through."""
    if "://" in run.storage_path:
        return run.storage_path
    return str(Path(run.storage_path).expanduser().resolve())


def spool_file(cfg: DictConfig, storage: str) -> Path:
    """Where tracking records wait when MLflow is unreachable: beside the checkpoints when the
    storage is a local/NFS path, else in the working directory."""
    from runtime.tracking_spool import spool_path

    base = Path("trainforge-spool").resolve() if "://" in storage else Path(storage)
    return spool_path(base / cfg.run.name)


def check_existing_run(cfg: DictConfig, storage: str) -> None:
    if "://" in storage:
        return
    run_dir = Path(storage) / cfg.run.name
    if run_dir.exists() and not cfg.checkpoint.resume:
        raise RecipeError(
            f"run.name: a run named {cfg.run.name!r} exists at {run_dir} and checkpoint.resume is "
            "false; pick another run.name or set checkpoint.resume=true"
        )


@dataclass
class Outcome:
    """What `trainforge train` ends with: exit status, final metrics, latest checkpoint."""

    exit_code: int
    metrics: dict[str, Any] = field(default_factory=dict)
    checkpoint_path: str | None = None
    mlflow_run_id: str | None = None
    backend: str = ""
    num_workers: int = 0


def train(cfg: DictConfig) -> Outcome:
    """Run the recipe to completion."""
    import ray
    import ray.train
    from ray.train.torch import TorchConfig

    _Trainer = _trainer_class()

    from runtime.workloads import check_workload_data, prepare_workload_data

    check_workload_data(cfg.workload)
    storage = storage_root(cfg.run)
    check_existing_run(cfg, storage)
    connect()
    use_gpu = check_resources(cfg.scaling, ray.cluster_resources(), cfg.precision.cuda_graphs)
    prepare_workload_data(cfg.workload, cfg.run.seed, storage)

    recipe = config.to_container(cfg)
    recipe_yaml = config.to_yaml(cfg)
    payload: dict[str, Any] = {"recipe": recipe, "run_dir": f"{storage}/{cfg.run.name}"}
    if os.environ.get(FAIL_AFTER_EPOCH_ENV):
        payload["fail_after_epoch"] = int(os.environ[FAIL_AFTER_EPOCH_ENV])
    handle = None
    if cfg.tracking.enabled:
        handle = tracking.start_run(
            cfg.tracking, cfg.run.name, recipe, recipe_yaml, str(spool_file(cfg, storage))
        )
        payload["mlflow"] = handle.for_workers()
        if handle.run_id is not None:
            state = "reopened" if handle.resumed else "created"
            print(f"[trainforge] MLflow run {handle.run_id} {state} at {handle.tracking_uri}")

    # ray.train.report blocks once the controller's one-slot result queue is full, until the
    # controller's next poll (2 s by default): poll faster so short epochs don't wait on it.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.2")
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
        run_config=ray.train.RunConfig(
            name=cfg.run.name,
            storage_path=storage,
            failure_config=ray.train.FailureConfig(max_failures=cfg.run.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.checkpoint.keep_last),
            # Ray Train logs every report at INFO; our own progress lines say what matters.
            logging_config=ray.train.LoggingConfig(log_level="WARNING"),
        ),
    )
    backend = "nccl" if use_gpu else "gloo"
    status, checkpoint_path = "FAILED", None
    try:
        result = trainer.fit()
        status = "FINISHED"
        checkpoint_path = result.checkpoint.path if result.checkpoint is not None else None
    except (KeyboardInterrupt, SystemExit, ray.train.TrainingFailedError) as exc:
        if trainer.interrupted or isinstance(exc, KeyboardInterrupt):
            status = "KILLED"
            print("[trainforge] interrupted; the run resumes from its last checkpoint when re-run")
            return Outcome(130, mlflow_run_id=handle and handle.run_id)
        if isinstance(exc, SystemExit):
            raise
        print(f"[trainforge] training failed: {exc}", file=sys.stderr)
        print(f"[trainforge] re-run with run.name={cfg.run.name} to resume", file=sys.stderr)
        return Outcome(1, mlflow_run_id=handle and handle.run_id)
    finally:
        if handle is not None:
            tracking.finish_run(handle, status, checkpoint_path)

    print(f"[trainforge] run {cfg.run.name!r} finished: {_format(result.metrics)}")
    if checkpoint_path:
        print(f"[trainforge] latest checkpoint: {checkpoint_path}")
    return Outcome(
        0,
        dict(result.metrics),
        checkpoint_path,
        handle and handle.run_id,
        backend=backend,
        num_workers=cfg.scaling.num_workers,
    )


def simulate(cfg: DictConfig) -> int:
    """`trainforge simulate`: only the data stage (SBI simulations), on the Ray cluster."""
    from runtime.workloads import check_workload_data, prepare_workload_data

    if cfg.workload.kind != "sbi":
        raise RecipeError(f"workload.kind: {cfg.workload.kind} has no simulation stage (sbi has)")
    check_workload_data(cfg.workload)
    storage = storage_root(cfg.run)
    connect()
    prepare_workload_data(cfg.workload, cfg.run.seed, storage)
    print(f"[trainforge] simulations ready: {cfg.workload.simulation.path}")
    return 0


def _trainer_class() -> type:
    from ray.train.torch import TorchTrainer

    class Trainer(TorchTrainer):
        """TorchTrainer that remembers a Ctrl-C: Ray Train's own SIGINT handler aborts the run
        gracefully and fit() then ends like a failure; the run must be recorded as KILLED."""

        interrupted = False

        def _register_sigint_handler(self, controller: Any) -> None:
            super()._register_sigint_handler(controller)
            ray_handler = signal.getsignal(signal.SIGINT)

            def on_sigint(signum: int, frame: Any) -> None:
                self.interrupted = True
                if callable(ray_handler):
                    ray_handler(signum, frame)

            signal.signal(signal.SIGINT, on_sigint)

    return Trainer


def _worker_entry(payload: dict[str, Any]) -> None:
    # Imported in the worker so the driver does not pay for the loop's imports twice.
    from runtime.trainer import train_worker

    train_worker(payload)


def _format(metrics: dict[str, Any]) -> str:
    return ", ".join(
        f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in sorted(metrics.items())
    )
