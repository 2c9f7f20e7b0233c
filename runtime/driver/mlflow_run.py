"""The command's MLflow run: made on a thread while the workers start (their run never waits for
MLflow), relayed from what rank 0 writes, and ended with the workers' outcome. One route on every
worker path (``tracking/relay.py``); where rank 0 may run on another node (Ray Train), the run is
also handed over to the workers that talk to MLflow themselves (``driver/mlflow_handover.py``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from trainforge import config, log, storage
from trainforge.config import Recipe
from trainforge.tracking import driver as tracking
from trainforge.tracking.client import RunHandle, redact, resolve_uri


def spool_file(cfg: Recipe, storage_path: str) -> Path:
    """Where tracking records wait when MLflow is unreachable: beside the checkpoints when the
    storage is a local/NFS path, else in the working directory."""
    from trainforge.tracking.spool import spool_path

    base = storage.local_folder(storage_path) or Path("trainforge-spool").resolve()
    return spool_path(base / cfg.run.name)


def start(
    cfg: Recipe,
    root: str,
    quiet: Any = None,
    tags: dict[str, str] | None = None,
    command_started: float | None = None,
) -> RunHandle:
    """Create or reopen the MLflow run, tagged with ``tags`` (default: this command's,
    ``tracking.driver_tags``), a new one starting when the command did (``command_started``,
    default this process's ``log.STARTED_AT``); its phase line unless ``quiet`` (a
    ``threading.Event``) is set by then."""
    started = time.time()
    handle = tracking.start_run(cfg.tracking, cfg.run.name, config.to_container(cfg),
                                config.to_yaml(cfg), str(spool_file(cfg, root)),
                                tags if tags is not None else tracking.driver_tags(),
                                resolve_uri(cfg.tracking.tracking_uri),
                                command_started)  # fmt: skip
    if handle.run_id is not None and not (quiet is not None and quiet.is_set()):
        state = "reopened" if handle.resumed else "created"
        log.phase("mlflow", f"run {handle.run_id} {state} at {redact(handle.tracking_uri)}",
                  started)  # fmt: skip
    return handle


def handle_for_workers(cfg: Recipe) -> RunHandle:
    """The run as its workers are given it before it is made: where rank 0 writes its records
    for the command to send (``tracking/relay.py``), where they wait while MLflow is away."""
    from trainforge.tracking import relay

    spool = spool_file(cfg, storage.absolute(cfg.run.storage_path))
    section = cfg.tracking
    return RunHandle(resolve_uri(section.tracking_uri), section.experiment, cfg.run.name, None,
                     False, str(spool), str(relay.relay_path(spool.parent)))  # fmt: skip


class MadeRun(Protocol):
    """A command's MLflow run in the making: ``CommandRun``, or the warm tracker's
    (``warm_tracker.TrackerRun``)."""

    for_workers: RunHandle

    def end(
        self,
        status: str,
        checkpoint_path: str | None = None,
        reason: str | None = None,
        quiet: bool = False,
    ) -> RunHandle | None: ...


class CommandRun:
    """The run in the making (``begin``), and its end (``end``). Made in the command, or, for
    warm workers, in the lasting cluster's warm tracker (``driver/warm_tracker.py``), given the
    command's ``tags`` and start (``command_started``)."""

    def __init__(
        self,
        cfg: Recipe,
        hand_over: Callable[[Any], None] | None,
        tags: dict[str, str] | None = None,
        leftover_end: int | None = None,
        command_started: float | None = None,
    ) -> None:
        from trainforge.tracking import relay
        from trainforge.workloads import spec_for

        root = storage.absolute(cfg.run.storage_path)
        section = cfg.tracking
        self.for_workers = handle_for_workers(cfg)
        interval = section.system_metrics_interval_s if section.system_metrics else None
        imports = spec_for(cfg.workload.kind).model_imports if section.log_model else ()
        self.making: relay.RunInTheMaking = relay.RunInTheMaking(
            lambda: start(cfg, root, self.making.quiet, tags, command_started),
            self.for_workers, interval, imports, hand_over, leftover_end,
        )  # fmt: skip

    @classmethod
    def begin(
        cls,
        cfg: Recipe,
        hand_over: Callable[[Any], None] | None = None,
        tags: dict[str, str] | None = None,
        leftover_end: int | None = None,
        command_started: float | None = None,
    ) -> CommandRun:
        """The run, being made (``hand_over``: where the workers that talk to MLflow themselves
        are given it; ``leftover_end``: the relay file's size before the workers started, where
        it was measured by the command — ``relay.RunInTheMaking``)."""
        run = cls(cfg, hand_over, tags, leftover_end, command_started)
        run.making.start()  # from here on a Ctrl-C still ends the run (``end``)
        return run

    def end(
        self,
        status: str,
        checkpoint_path: str | None = None,
        reason: str | None = None,
        quiet: bool = False,
    ) -> RunHandle | None:
        """Once the workers are done: the run's making waited for (``quiet``: without its phase
        line, as after an interruption's line), the final model rank 0 kept logged where the
        run finished, rank 0's last records sent, and the run's closing facts and status. Its
        handle, or None where it could not be made."""
        if quiet:
            self.making.quiet.set()
        handle, relay = self.making.made()
        if relay is not None and status == "FINISHED":
            relay.log_kept_model()
        elif status == "FINISHED":  # no run to log it to: kept for `trainforge tracking-sync`
            from trainforge.tracking import relay as relaying

            relaying.spool_kept_model(self.making.path, handle or self.making.for_workers)
        self.making.stop()  # rank 0's last records, before the run's closing facts
        if handle is not None:
            tracking.finish_run(handle, status, checkpoint_path, reason)
        return handle
