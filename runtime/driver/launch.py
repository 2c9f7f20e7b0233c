"""Driver side of ``trainforge train``: connect to Ray, check resources, open the MLflow run,
build the ``TorchTrainer`` and run it.

Every check that can fail because of the user's request happens here, before any worker
starts, and raises RecipeError.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainforge import config, log, ray_compat, storage
from trainforge.config import Recipe
from trainforge.config.resolve import worker_resources
from trainforge.driver import (
    bytecode,
    collective_timeout,
    console,
    disk_full,
    finished_run,
    local_cluster,
    out_of_memory,
    own_workers,
    recipe_change,
    resource_wait,
    warm_pool,
)
from trainforge.driver.cluster import connect, on_lasting_cluster, storage_root
from trainforge.driver.run_lock import one_at_a_time
from trainforge.errors import NonFiniteLoss, RecipeError
from trainforge.log import first_line
from trainforge.tracking import driver as tracking
from trainforge.tracking.client import redact
from trainforge.worker import faults, settings

INTERRUPTED = "interrupted; the run resumes from its last checkpoint when re-run"


def spool_file(cfg: Recipe, storage_path: str) -> Path:
    """Where tracking records wait when MLflow is unreachable: beside the checkpoints when the
    storage is a local/NFS path, else in the working directory."""
    from trainforge.tracking.spool import spool_path

    base = storage.local_folder(storage_path) or Path("trainforge-spool").resolve()
    return spool_path(base / cfg.run.name)


def check_existing_run(cfg: Recipe, storage_path: str) -> Path | None:
    """Refuse a run name taken without ``checkpoint.resume``, or whose checkpoints all fail
    verification; the folder of the checkpoint a resume starts from (None: a new run, or
    remote storage)."""
    folder = storage.local_folder(storage_path)
    if folder is None:
        return None
    run_dir = folder / cfg.run.name
    if run_dir.exists() and not cfg.checkpoint.resume:
        raise RecipeError(
            f"run.name: a run named {cfg.run.name!r} exists at {run_dir} and checkpoint.resume is "
            "false; pick another run.name or set checkpoint.resume=true"
        )
    if not run_dir.is_dir():
        return None  # a new run: no checkpoints to check
    from trainforge.checkpoint import check_resumable

    return check_resumable(run_dir)  # checkpoints that all fail verification: refused


@dataclass
class Outcome:
    """What `trainforge train` ends with: exit status, final metrics, latest checkpoint."""

    exit_code: int
    metrics: dict[str, Any] = field(default_factory=dict)
    checkpoint_path: str | None = None
    mlflow_run_id: str | None = None
    tracking_uri: str | None = None
    """Where that MLflow run is."""
    backend: str = ""
    """The process group's backend, as the workers reported it (nccl, gloo)."""
    num_workers: int = 0
    """The process group's world size, as the workers reported it."""
    recipe: Recipe | None = None
    """The resolved recipe the run trained (worker count, device, data paths filled in)."""


@one_at_a_time  # a second command with the same run.name refuses
def train(cfg: Recipe) -> Outcome:
    """Run the recipe to completion."""
    from trainforge.workloads import check_workload_data

    check_workload_data(cfg.workload)
    root = storage_root(cfg.run)
    resumed_from = check_existing_run(cfg, root)  # verified once: its files are hashed here
    folder = storage.local_folder(root)
    run_dir = folder / cfg.run.name if folder is not None else None  # None: remote storage
    request = finished_run.requested(cfg)  # as given: `auto` is resolved from here on
    done = finished_run.nothing_left(run_dir, request, resumed_from)
    if run_dir is not None and done is not None:  # a finished run: its outcome, no worker
        return _finished_earlier(cfg, run_dir, done)
    outcome = _train(cfg, root, resumed_from)
    if outcome.exit_code == 0 and run_dir is not None:
        finished_run.record(run_dir, request, outcome)
    return outcome


def _finished_earlier(cfg: Recipe, run_dir: Path, done: dict[str, Any]) -> Outcome:
    """The outcome of a run that has nothing left to train (``finished_run.record``'s keys),
    said again."""
    checkpoint = str(run_dir / done["checkpoint"])
    run_id, uri = done.get("mlflow_run_id"), done.get("tracking_uri")
    heading = (
        f"run {cfg.run.name!r} finished earlier ({done.get('finished_at')}): nothing left to train"
    )
    metrics = done["metrics"]
    console.summary(cfg.run.name, metrics, checkpoint, (run_id, uri or "") if run_id else None,
                    heading)  # fmt: skip
    log.say("a larger train.epochs or train.max_steps trains it further (unless early stopping "
            "ended it); a new run.name starts afresh")  # fmt: skip
    return Outcome(0, metrics, checkpoint, run_id, uri, recipe=cfg)


def _train(cfg: Recipe, root: str, resumed_from: Path | None) -> Outcome:
    """The run, on the command's own workers, warm workers or Ray Train's."""
    from trainforge.workloads import start_workload_data

    start_workload_data(cfg.workload, cfg.run.seed, root)  # what needs no cluster, while Ray starts
    if own_workers.unavailable(cfg, root) is None:  # no cluster runs: none is waited for
        log.say(own_workers.phase_line())
        return _train_on_own_workers(cfg, root, resumed_from)
    import ray

    connect()
    # From here on the run uses the resolved recipe: workers, MLflow and checkpoints see the
    # worker count, device and data paths that were decided, not "auto".
    cfg = config.resolve_workers(cfg, ray.cluster_resources())
    why_not_warm = warm_pool.unavailable(cfg, root, on_lasting_cluster())
    # new warm workers' imports overlap the data stage instead of following it
    ahead = warm_pool.prestart(cfg) if why_not_warm is None else {}
    if ahead or why_not_warm:  # new worker processes import torch now
        bytecode.warn_if_workers_compile_torch()
    cfg = config.resolve_data(cfg, root)
    recipe_change.check(cfg, root, resumed_from)  # another recipe: refused, or said

    payload = worker_payload(cfg, root)
    ray_compat.time_out_report_barriers(cfg.scaling.timeout_s)  # like the process group's
    failed: tuple[type[BaseException], ...] = (warm_pool.WorkersFailed,)
    if why_not_warm:  # Ray Train's import (~1 s) only where it runs the workers
        import ray.train

        failed += (ray.train.TrainingFailedError,)
    worker_output = console.attach(storage.local_folder(root), cfg.run.name)
    try:
        return run_workers(cfg, payload, root, why_not_warm, ahead, failed, worker_output)
    finally:
        if worker_output is not None:
            worker_output.close()


def _train_on_own_workers(cfg: Recipe, root: str, resumed_from: Path | None) -> Outcome:
    """The run on the command's own worker processes (``own_workers.py``), started before the
    data stage so that their imports overlap it; the lasting cluster starts in the background
    afterwards, for later commands, unless none is kept (TRAINFORGE_KEEP_CLUSTER=0)."""
    cfg = config.resolve_workers(cfg, own_workers.resources(), "this machine")
    bytecode.warn_if_workers_compile_torch()
    team = own_workers.OwnRun(cfg)
    try:
        cfg = config.resolve_data(cfg, root)
        recipe_change.check(cfg, root, resumed_from)
        payload = worker_payload(cfg, root)
        folder = storage.local_folder(root)
        worker_output = None
        if log.verbosity() <= 0 and folder is not None:  # -v: every worker line as it comes
            worker_output = console.Console(folder / cfg.run.name / "worker-output.log")
        try:
            team.attach(payload, worker_output)
            outcome = run_workers(cfg, payload, root, None, {}, (warm_pool.WorkersFailed,),
                                  worker_output, own=team)  # fmt: skip
        finally:
            team.close()  # the workers' last lines, before their output closes
            if worker_output is not None:
                worker_output.close()
    finally:
        team.close()
    # a run was made, and not given up: more may follow, unless no cluster is to be kept
    if outcome.exit_code != 130 and local_cluster.keep_cluster():
        own_workers.start_cluster_in_background(cfg)
    return outcome


def _worker_died(exc: BaseException) -> str | None:
    """One line where a worker's process died mid-run (the OOM killer, a kill -9, a crash),
    instead of Ray Train's dump of every rank (the others' errors only follow from it: a
    collective's peer gone)."""
    for rank, error in ray_compat.worker_failures(exc).items():
        died = warm_pool.worded(error, rank)
        if isinstance(died, warm_pool.WorkerDied):
            return f"{died}; the same command resumes from the last checkpoint"
    return None


def worker_payload(cfg: Recipe, root: str) -> dict[str, Any]:
    """What every worker is given: the resolved recipe, the run folder, this command's settings."""
    payload: dict[str, Any] = {"recipe": config.to_container(cfg)}
    payload["run_dir"] = f"{root}/{cfg.run.name}"
    payload |= faults.requested()  # TRAINFORGE_FAIL_AFTER_EPOCH and the like, for tests
    payload["command"] = os.urandom(8).hex()  # its restarts are counted (worker/restarts.py)
    payload["env"] = local_cluster.worker_env()  # this command's settings, on every worker
    payload["workers_requested_at"] = time.time()  # the workers say how long they took
    return payload


def run_workers(
    cfg: Recipe,
    payload: dict[str, Any],
    root: str,
    why_not_warm: str | None,
    ahead: dict[str, Any],
    failed: tuple[type[BaseException], ...],
    worker_output: Any,
    own: own_workers.OwnRun | None = None,
    warm_slots: list[int] | None = None,
) -> Outcome:
    """The MLflow run and the workers' run, on the command's ``own`` workers, on warm workers
    (with those this command started ``ahead``; on ``warm_slots`` unclaimed, else on free slots
    it claims) or Ray Train's."""
    recipe, recipe_yaml = payload["recipe"], config.to_yaml(cfg)
    status, checkpoint_path, reason, handle, relay = "FAILED", None, None, None, None
    caught: tuple[type[BaseException], ...] = (KeyboardInterrupt, SystemExit, *failed)
    with contextlib.ExitStack() as stack:
        warm = None if why_not_warm or own else stack.enter_context(
            warm_pool.WarmRun(cfg, payload, worker_output, ahead, warm_slots)
        )  # fmt: skip
        track = warm.track if warm else _track_here
        interrupted = [False]
        making, told = None, False
        try:
            if cfg.tracking.enabled and (own is not None or warm is None):
                # made while the command's own workers or Ray Train's start
                handover = hand_over_to_ray_train(payload) if own is None else None
                if handover is not None:
                    stack.callback(handover.close)
                making = run_in_the_making(cfg, root, recipe, recipe_yaml, handover)
                making.start()  # once named here: a Ctrl-C from now on still ends the run
                payload["mlflow"] = making.for_workers.for_workers()
            elif cfg.tracking.enabled:
                handle = start_tracking(cfg, root, recipe, recipe_yaml, track)
                spool_relay_rest(handle)
                payload["mlflow"] = handle.for_workers()
            if own is not None:
                try:
                    finished = own.run()
                except KeyboardInterrupt:
                    # said at once: the MLflow run may take seconds more to be made and closed
                    if making is not None:
                        making.quiet.set()
                    log.say(INTERRUPTED)
                    told = True
                    raise
                finally:  # the run's handle, for what follows, whatever the workers' end
                    if making is not None:
                        handle, relay = making.made()
                metrics, checkpoint_path = finished.metrics, finished.checkpoint_path
                if relay is not None and finished.model is not None:
                    relay.log_model(finished.model)
            elif warm is not None:
                finished = warm.fit()
                metrics, checkpoint_path = finished.metrics, finished.checkpoint_path
            else:
                try:
                    metrics, checkpoint_path = _fit_ray_train(cfg, payload, root, interrupted)
                finally:  # the run's handle, for what follows, whatever the workers' end
                    if making is not None:
                        if interrupted[0]:  # the interruption's line stays the console's last
                            making.quiet.set()
                        handle, relay = making.made()
                if relay is not None:
                    relay.log_kept_model()
            status = "FINISHED"
        except caught as exc:
            if interrupted[0] or isinstance(exc, KeyboardInterrupt):
                status = "KILLED"
                if not told:
                    log.say(INTERRUPTED)
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
                or _worker_died(exc)
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
            if making is not None:
                if handle is None:  # stopped before the workers' run began: the run still ends
                    making.quiet.set()
                    handle, _ = making.made()
                making.stop()  # rank 0's last records, before the run's closing facts
            if handle is not None:
                track("finish_run", handle, status, checkpoint_path, reason)

    metrics = dict(metrics)
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
        handle.tracking_uri if handle else None,
        backend=backend,
        num_workers=num_workers,
        recipe=cfg,
    )


def start_tracking(
    cfg: Recipe,
    root: str,
    recipe: dict[str, Any],
    recipe_yaml: str,
    track: Any = None,
    quiet: Any = None,
) -> Any:
    """Create or reopen the MLflow run (through ``track``: here by default, or in a warm
    worker); its phase line unless ``quiet`` (a ``threading.Event``) is set by then."""
    from trainforge.tracking.client import resolve_uri

    started = time.time()
    track = track or _track_here
    handle = track("start_run", cfg.tracking, cfg.run.name, recipe, recipe_yaml,
                   str(spool_file(cfg, root)), tracking.driver_tags(),
                   resolve_uri(cfg.tracking.tracking_uri))  # fmt: skip
    if handle.run_id is not None and not (quiet is not None and quiet.is_set()):
        state = "reopened" if handle.resumed else "created"
        uri = redact(handle.tracking_uri)
        log.phase("mlflow", f"run {handle.run_id} {state} at {uri}", started)
    return handle


def hand_over_to_ray_train(payload: dict[str, Any]) -> Any:
    """Ray Train's workers, placed by Ray: their rank 0 relays where it runs on this command's
    node (``payload`` names it); the run is handed through Ray to those that talk to MLflow
    themselves (``driver/mlflow_handover.py``): the handover, closed at the end."""
    import ray

    from trainforge.driver.mlflow_handover import Handover
    from trainforge.tracking.client import HANDOVER_FIELD, RELAY_NODE_FIELD

    handover = Handover(f"mlflow-run-{payload['command']}")
    payload[HANDOVER_FIELD] = handover.key
    payload[RELAY_NODE_FIELD] = ray.get_runtime_context().get_node_id()
    return handover


def run_in_the_making(
    cfg: Recipe,
    root: str,
    recipe: dict[str, Any],
    recipe_yaml: str,
    hand_over: Callable[[Any], None] | None = None,
) -> Any:
    """The MLflow run of the command's own workers or Ray Train's (with ``hand_over``), to be
    made on a thread (not started yet) while they start: rank 0 writes its records to the run
    folder for this process to send (``tracking/relay.py``)."""
    from trainforge.tracking import relay
    from trainforge.tracking.client import RunHandle, resolve_uri
    from trainforge.workloads import spec_for

    section = cfg.tracking
    spool = spool_file(cfg, root)
    relay_file = str(relay.relay_path(spool.parent))
    uri = resolve_uri(section.tracking_uri)
    for_workers = RunHandle(
        uri, section.experiment, cfg.run.name, None, False, str(spool), relay_file
    )
    interval = section.system_metrics_interval_s if section.system_metrics else None
    imports = spec_for(cfg.workload.kind).model_imports if section.log_model else ()
    making = relay.RunInTheMaking(
        lambda: start_tracking(cfg, root, recipe, recipe_yaml, quiet=making.quiet),
        for_workers, interval, imports, hand_over,
    )  # fmt: skip
    return making


def spool_relay_rest(handle: Any) -> None:
    """What an earlier command of the run left in its relay file, spooled: this one's rank 0
    sends its own records."""
    from trainforge.tracking import relay

    run_dir = Path(handle.spool_path).parent
    relay.spool_rest(relay.relay_path(run_dir), Path(handle.spool_path))


def _track_here(call: str, *args: Any) -> Any:
    return getattr(tracking, call)(*args)


def _fit_ray_train(
    cfg: Recipe, payload: dict[str, Any], root: str, interrupted: list[bool]
) -> tuple[dict[str, Any], str | None]:
    """The run on a worker group of Ray Train's: new processes, placed by Ray, restarted by
    Ray Train. Returns the final metrics and the latest checkpoint's path."""
    import ray.train

    from trainforge.process_group import ProcessGroupConfig

    use_gpu = cfg.scaling.use_gpu == "true"
    trainer = ray_compat.trainer_class()(
        train_loop_per_worker=_worker_entry,
        train_loop_config=payload,
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
            storage_path=root,
            failure_config=ray.train.FailureConfig(max_failures=cfg.run.max_failures),
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=cfg.checkpoint.keep_last),
            # Ray Train logs every report at INFO; our own progress lines say what matters.
            logging_config=ray.train.LoggingConfig(log_level="WARNING"),
            # set when each worker process starts, before Ray Train makes its CUDA context
            worker_runtime_env={"env_vars": settings.gpu_worker_env(os.environ)}
            if use_gpu
            else None,
        ),
    )
    try:
        with resource_wait.said_while_pending():  # a busy cluster: its workers wait, said
            result = trainer.fit()
    finally:
        interrupted[0] = bool(trainer.interrupted)
    checkpoint = result.checkpoint.path if result.checkpoint is not None else None
    return dict(result.metrics), checkpoint


def simulate(cfg: Recipe) -> int:
    """`trainforge simulate`: only the data stage (SBI simulations), on the Ray cluster."""
    prepare_data(cfg)
    return 0


def prepare_data(cfg: Recipe) -> Any:
    """The data stage alone (SBI simulations, made or found in the cache, on the Ray cluster
    this process joins): the workload section with the data's place filled in."""
    from trainforge.workloads import (
        check_workload_data,
        resolve_workload,
        spec_for,
        start_workload_data,
    )

    if spec_for(cfg.workload.kind).prepare_data is None:
        raise RecipeError(f"workload.kind: {cfg.workload.kind} has no simulation stage (sbi has)")
    check_workload_data(cfg.workload)
    root = storage_root(cfg.run)
    storage.check_writable(root, cfg.run.name)  # the simulations are written under it
    start_workload_data(cfg.workload, cfg.run.seed, root)
    connect()
    return resolve_workload(cfg.workload, cfg.run.seed, root)  # says where the data are


def _worker_entry(payload: dict[str, Any]) -> None:
    import ray.train

    from trainforge.worker import settings

    settings.apply(payload.get("env", {}))

    context = ray.train.get_context()
    if context.get_world_rank() == 0 and "workers_requested_at" in payload:
        size = context.get_world_size()
        log.phase("workers", f"{size} started, process group up", payload["workers_requested_at"])
    # Imported in the worker so the driver does not pay for the loop's imports twice.
    from trainforge.worker.trainer import train_worker

    train_worker(payload)
