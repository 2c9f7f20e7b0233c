"""MLflow tracking: the driver owns the run's lifecycle, rank 0 logs metrics into it.

The run is found again by its run name (tag ``trainforge.run_name``) so a restart, a resubmitted
job or a retry continues the same MLflow run. Tracking problems never stop training: they are
reported once and training goes on.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.distributed import WorkerContext

RUN_NAME_TAG = "trainforge.run_name"
DEFAULT_URI = "sqlite:///mlflow.db"


@dataclass
class RunHandle:
    tracking_uri: str
    run_id: str
    resumed: bool


def resolve_uri(configured: str | None) -> str:
    """Recipe value, else $MLFLOW_TRACKING_URI, else SQLite in the working directory — made
    absolute, because Ray workers run in another directory."""
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_URI
    prefix = "sqlite:///"
    if uri.startswith(prefix) and not uri.startswith(prefix + "/"):
        uri = prefix + str(Path(uri[len(prefix) :]).resolve())
    return uri


def flatten(data: Any, prefix: str = "") -> dict[str, str]:
    """Nested recipe → dotted keys (MLflow does not flatten dicts); values cut to 6,000 chars."""
    if isinstance(data, dict):
        out: dict[str, str] = {}
        for key, value in data.items():
            out.update(flatten(value, f"{prefix}{key}."))
        return out
    return {prefix.rstrip("."): str(data)[:6000]}


def start_run(section: Any, run_name: str, recipe: dict[str, Any], recipe_yaml: str) -> RunHandle:
    """Create the MLflow run for ``run_name`` or reopen it when it exists."""
    import mlflow
    from mlflow.tracking import MlflowClient

    uri = resolve_uri(section.tracking_uri)
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name(section.experiment)
    experiment_id = (
        experiment.experiment_id if experiment else client.create_experiment(section.experiment)
    )
    found = client.search_runs(
        [experiment_id], filter_string=f"tags.`{RUN_NAME_TAG}` = '{run_name}'", max_results=1
    )
    if found:
        run_id = found[0].info.run_id
        client.update_run(run_id, status="RUNNING")
        return RunHandle(uri, run_id, resumed=True)
    run = client.create_run(experiment_id, run_name=run_name, tags={RUN_NAME_TAG: run_name})
    run_id = run.info.run_id
    params = [mlflow.entities.Param(k, v) for k, v in flatten(recipe).items()]
    for start in range(0, len(params), 100):
        client.log_batch(run_id, params=params[start : start + 100])
    client.log_text(run_id, recipe_yaml, "recipe.yaml")
    return RunHandle(uri, run_id, resumed=False)


def end_run(handle: RunHandle, status: str) -> None:
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=handle.tracking_uri).set_terminated(handle.run_id, status=status)


class WorkerTracker:
    """Rank 0's metric logger: buffers metrics and sends them in batches."""

    def __init__(self, handle: dict[str, str] | None, ctx: WorkerContext) -> None:
        self.enabled = handle is not None and ctx.is_main
        self.buffer: list[Any] = []
        self.failed = False
        if self.enabled:
            from mlflow.tracking import MlflowClient

            assert handle is not None
            self.client = MlflowClient(tracking_uri=handle["tracking_uri"])
            self.run_id = handle["run_id"]

    def log(self, metrics: dict[str, float], step: int) -> None:
        if not self.enabled:
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.buffer.extend(Metric(k, float(v), now, step) for k, v in metrics.items())

    def flush(self) -> None:
        if not self.enabled or not self.buffer:
            return
        try:
            for start in range(0, len(self.buffer), 1000):
                self.client.log_batch(self.run_id, metrics=self.buffer[start : start + 1000])
            self.buffer.clear()
        except Exception as exc:  # tracking must never stop training
            if not self.failed:
                print(
                    f"[trainforge] MLflow logging failed, training goes on: {exc}", file=sys.stderr
                )
            self.failed = True

    def close(self) -> None:
        self.flush()
