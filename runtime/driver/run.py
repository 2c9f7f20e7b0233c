"""One run of a recipe on a worker group: the workers' run with restarts (``workers/base.py``),
the MLflow run made beside it (``mlflow_run.py``), a failure said in one line
(``workers/failures.py``), the outcome and its closing table. The same on every worker path; a
command's run (``launch.py``) and a background start's rehearsal (``rehearsal.py``) both come
here."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from trainforge import config, log, settings
from trainforge.config import Recipe
from trainforge.driver import console, local_cluster
from trainforge.driver.mlflow_run import MadeRun
from trainforge.driver.workers import failures
from trainforge.driver.workers.base import Finished, WorkerGroup, WorkersFailed, run_with_restarts
from trainforge.worker.payload import WorkerPayload

INTERRUPTED = "interrupted; the run resumes from its last checkpoint when re-run"


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


def worker_payload(cfg: Recipe, root: str) -> WorkerPayload:
    """What every worker is given: the resolved recipe, the run folder, this command's settings."""
    return WorkerPayload(
        recipe=config.to_container(cfg),
        run_dir=f"{root}/{cfg.run.name}",
        command=os.urandom(8).hex(),  # its restarts are counted (worker/restarts.py)
        env=local_cluster.worker_env(),  # this command's settings, on every worker
        plugins=settings.worker_plugins(),
    )


def run_workers(cfg: Recipe, payload: WorkerPayload, group: WorkerGroup) -> Outcome:
    """The workers' run on ``group``, with restarts, and the MLflow run made beside it."""
    record: MadeRun | None = None
    try:
        payload = group.prepare(payload)  # the workers' lines are shown from here on
        if cfg.tracking.enabled:
            record = group.begin_run(cfg)
            payload = payload.but(mlflow=record.for_workers.for_workers())
        finished = run_with_restarts(group, payload, cfg.run.max_failures)
    except KeyboardInterrupt:
        group.close()  # their last lines before the command's
        log.say(INTERRUPTED)  # at once: the MLflow run may take seconds more to end
        return Outcome(130, mlflow_run_id=_ended(record, "KILLED", quiet=True))
    except WorkersFailed as exc:
        group.close()
        reason = failures.said(exc, cfg, payload.run_dir)
        return Outcome(1, mlflow_run_id=_ended(record, "FAILED", reason=reason))
    except BaseException:
        group.close()
        _ended(record, "FAILED")
        raise
    group.close()  # their last lines (an SBI run's evaluation) before the closing table
    handle = record.end("FINISHED", finished.checkpoint_path) if record is not None else None
    return _finished(cfg, finished, handle)


def _ended(record: MadeRun | None, status: str, **how: Any) -> str | None:
    handle = record.end(status, **how) if record is not None else None
    return handle.run_id if handle is not None else None


def _finished(cfg: Recipe, finished: Finished, handle: Any) -> Outcome:
    """The closing table of a finished run, and its outcome."""
    metrics = dict(finished.metrics)
    # what the workers' process group was, as they reported it (worker/state.py's keys)
    backend = str(metrics.pop("worker/backend", ""))
    num_workers = int(metrics.pop("worker/world_size", 0))
    run_id, uri = (handle.run_id, handle.tracking_uri) if handle is not None else (None, None)
    console.summary(cfg.run.name, metrics, finished.checkpoint_path,
                    (run_id, uri) if run_id and uri else None)  # fmt: skip
    return Outcome(0, metrics, finished.checkpoint_path, run_id, uri, backend=backend,
                   num_workers=num_workers, recipe=cfg)  # fmt: skip
