"""Ray Train's worker group as a command's worker group: new processes placed by Ray, on any node
of the cluster — the group of clusters joined by address (``ray job submit``, KubeRay, SLURM)
and of the lasting local cluster where warm workers are off. One ``fit()`` is one attempt: Ray
Train's own restarts are off (``FailureConfig(max_failures=0)``) and the runtime's one failure
policy (``base.run_with_restarts``) decides, so a restart is said and counted as on every path.

The process group is joined through the one join every worker uses (``worker/process_group.py``),
set up by a backend of our own (``ray_train_backend.py``).

Rank 0 may run on another node than the command's: where it runs on the command's node it writes
its records for the command to send (``tracking/relay.py``); elsewhere it sends them itself, with
the MLflow run handed over through Ray (``driver/mlflow_handover.py``).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import ray
import ray.train

from trainforge import ray_compat, settings, storage
from trainforge.config import Recipe
from trainforge.config.resolve import worker_resources
from trainforge.driver import console, resource_wait
from trainforge.driver.mlflow_handover import Handover
from trainforge.driver.workers.base import (
    Failures,
    Finished,
    WorkerGroup,
    WorkersFailed,
    from_ray,
    run_imports,
)
from trainforge.driver.workers.ray_train_backend import ProcessGroupConfig
from trainforge.worker import environment
from trainforge.worker import ray_train as on_workers
from trainforge.worker.payload import WorkerPayload


class RayTrainWorkers(WorkerGroup):
    kind = "ray-train"
    rank0_may_be_elsewhere = True

    def __init__(self, cfg: Recipe) -> None:
        super().__init__(cfg)
        self._held = contextlib.ExitStack()
        self.attempts = 0

    def start(self) -> None:
        from trainforge.driver import bytecode

        bytecode.warn_if_workers_compile_torch()  # each fit() starts new processes

    def prepare(self, payload: WorkerPayload) -> WorkerPayload:
        ray_compat.time_out_report_barriers(self.cfg.scaling.timeout_s)  # like the group's
        output = console.attach(storage.local_folder(payload.run_dir))
        if output is not None:
            self._held.callback(output.close)
        handover = Handover(f"mlflow-run-{payload.command}")
        self._held.callback(handover.close)
        self.hand_over = handover
        return payload.but(handover_key=handover.key,
                           relay_node=ray.get_runtime_context().get_node_id())  # fmt: skip

    def run(self, payload: WorkerPayload) -> Finished | Failures:
        trainer = self._trainer(payload)
        self.attempts += 1
        try:
            # a busy cluster: its workers wait, said (a restart's, after the first attempt)
            with resource_wait.said_while_pending(restart=self.attempts > 1):
                result = trainer.fit()
        except (ray.train.TrainingFailedError, SystemExit) as exc:
            # a Ctrl-C: Ray Train's own handler aborts the run, which then ends as a failure or
            # with sys.exit from inside that handler
            if trainer.interrupted:
                raise KeyboardInterrupt from None
            if isinstance(exc, SystemExit):
                raise
            failures = ray_compat.worker_failures(exc)
            if not failures:  # not the workers' (Ray Train's controller): no restart helps
                raise WorkersFailed({}, str(exc)) from exc
            return {rank: from_ray(error, rank) for rank, error in failures.items()}
        if trainer.interrupted:
            raise KeyboardInterrupt
        checkpoint = result.checkpoint.path if result.checkpoint is not None else None
        return Finished(dict(result.metrics), checkpoint)

    def _trainer(self, payload: WorkerPayload) -> Any:
        cfg = self.cfg
        use_gpu = cfg.scaling.use_gpu == "true"
        return ray_compat.trainer_class()(
            train_loop_per_worker=on_workers.entry,
            train_loop_config={"payload": payload},
            backend_config=ProcessGroupConfig(
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
                storage_path=os.path.dirname(payload.run_dir),
                failure_config=ray.train.FailureConfig(max_failures=0),  # base.run_with_restarts
                checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.checkpoint.keep_last),
                # Ray Train logs every report at INFO; our own progress lines say what matters.
                logging_config=ray.train.LoggingConfig(log_level="WARNING"),
                worker_runtime_env=self._worker_env(use_gpu),
            ),
        )

    def _worker_env(self, use_gpu: bool) -> dict[str, Any] | None:
        """What the run imports beyond torch and the loop (dynamo for DDP, the workload's
        modules) imported by each worker process from its start (``on_workers.preload``); on
        GPUs, the settings CUDA reads when its context is made, before Ray Train makes it.

        Torch and the loop alone are not preloaded: the group's join imports torch at once,
        and on one H100 a thread importing them beside Ray Train's set-up of the worker made
        the group's start ~1 s slower (2 rounds); dynamo, which DDP's constructor imports
        after the join, is 3.7 s of a worker on this project's CPU, there in parallel."""
        env_vars: dict[str, str] = {}
        imports = run_imports(self.cfg)
        if imports:
            hook = f"{on_workers.__name__}.{on_workers.preload.__name__}"
            env_vars |= {settings.PRELOAD.name: ",".join(imports),
                         **ray_compat.setup_hook_env(hook)}  # fmt: skip
        if use_gpu:
            env_vars |= environment.gpu_worker_env(os.environ)
        return {"env_vars": env_vars} if env_vars else None

    def close(self) -> None:
        self._held.close()
