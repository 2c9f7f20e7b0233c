"""What could not reach the MLflow server, kept on disk and replayed later.

Training never waits for tracking: when the server is unreachable (at start, or mid-run after
retries), the records go to ``<storage_path>/<run.name>/tracking-spool.jsonl``, one JSON object
a line. ``trainforge tracking-sync RUN_DIR`` replays them into the run — the one they were written
for, else the run folder's (``client.find_or_create_run``), created if the server never saw
it — and removes the file once everything is in.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from trainforge.log import counted
from trainforge.tracking.client import (
    RunHandle,
    after,
    find_or_create_run,
    redact,
    terminate,
)
from trainforge.tracking.datasets import TrainingData

SPOOL_FILE = "tracking-spool.jsonl"
_lock = threading.Lock()


class Spool:
    def __init__(self, path: str | Path, run: dict[str, str]) -> None:
        """``run``: tracking_uri, experiment and run_name — enough to find or recreate the run."""
        self.path = Path(path)
        self.run = run

    @classmethod
    def of(cls, handle: RunHandle) -> Spool:
        return cls(handle.spool_path, handle.identity())

    def write(self, kind: str, **data: Any) -> None:
        record = {"kind": kind, "run": self.run, **data}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with _lock, self.path.open("a") as stream:
            stream.write(json.dumps(record) + "\n")
            stream.flush()
            os.fsync(stream.fileno())


def spool_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / SPOOL_FILE


def with_credentials(recorded: str) -> str:
    """The spool keeps URIs without credentials (``https://***@host``): take them back from
    $MLFLOW_TRACKING_URI when it names the same server; else MLflow's
    MLFLOW_TRACKING_USERNAME/PASSWORD must supply them."""
    if "***@" not in recorded:
        return recorded
    configured = os.environ.get("MLFLOW_TRACKING_URI", "")
    if configured and redact(configured) == recorded:
        return configured
    return recorded.replace("***@", "", 1)


def replay(path: str | Path, tracking_uri: str | None = None) -> dict[str, int]:
    """Send every spooled record to MLflow; returns counts by kind. Raises on failure, leaving
    the spool in place (replay is idempotent for params, tags, status, artifacts and dataset
    inputs; metrics are only sent once because the file is removed after a complete replay)."""
    from mlflow.tracking import MlflowClient

    path = Path(path)
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    counts: dict[str, int] = {}
    run_ids: dict[tuple[str, str, str], str] = {}
    for record in records:
        run = record["run"]
        uri = tracking_uri or with_credentials(run["tracking_uri"])
        client = MlflowClient(tracking_uri=uri)
        key = (uri, run["experiment"], run["run_name"])
        if run.get("run_id") and tracking_uri is None:  # the run it was written for
            run_ids[key] = run["run_id"]
        elif key not in run_ids:  # the run folder's run, or a new one (the server never saw it)
            found = find_or_create_run(client, uri, run["experiment"], run["run_name"], path.parent)
            run_ids[key] = found[0]
        run_id = run_ids[key]
        kind = send(client, run_id, record)
        counts[kind] = counts.get(kind, 0) + 1
    path.unlink()
    return counts


# each kind of record ``send`` takes, named for what ``tracking-sync`` says it sent
KIND_NAMES = {
    "artifact": ("file", "files"),
    "dataset": ("dataset", "datasets"),
    "metrics": ("batch of metrics", "batches of metrics"),
    "model": ("model", "models"),
    "params": ("batch of params", "batches of params"),
    "status": ("run status", "run statuses"),
    "tags": ("set of tags", "sets of tags"),
    "text": ("text file", "text files"),
}


def described(counts: dict[str, int]) -> str:
    """``replay``'s counts in words: ``2 files, 14 batches of metrics, 1 run status``."""
    return ", ".join(
        counted(n, *KIND_NAMES.get(kind, (f"{kind} record", f"{kind} records")))
        for kind, n in sorted(counts.items())
    )


def send(client: Any, run_id: str, record: dict[str, Any], logged_through: int = -1) -> str:
    """Send one record (as ``Spool.write`` wrote it) to the run ``run_id``; returns its kind.
    Metrics of steps up to ``logged_through`` are left out (``RunHandle.logged_through``)."""
    from mlflow.entities import Metric, Param

    kind = str(record["kind"])
    if kind == "metrics":
        rows = after(record["metrics"], logged_through)
        metrics = [Metric(k, v, ts, step) for k, v, ts, step in rows]
        for start in range(0, len(metrics), 1000):
            client.log_batch(run_id, metrics=metrics[start : start + 1000])
    elif kind == "params":
        params = [Param(k, v) for k, v in record["params"].items()]
        for start in range(0, len(params), 100):
            client.log_batch(run_id, params=params[start : start + 100])
    elif kind == "tags":
        for k, v in record["tags"].items():
            client.set_tag(run_id, k, v)
    elif kind == "artifact":
        client.log_artifact(run_id, record["local_path"], record.get("artifact_path"))
    elif kind == "text":
        client.log_text(run_id, record["text"], record["artifact_file"])
    elif kind == "dataset":
        TrainingData.from_record(record["dataset"]).log(client, run_id)
    elif kind == "model":  # the final model, which MLflow could not take at the time
        from trainforge.tracking.model_logging import log_handed

        handle = RunHandle(client.tracking_uri, "", "", run_id, True, "")
        if not log_handed(handle, Path(record["local_path"]).read_bytes()):
            raise RuntimeError(f"the model in {record['local_path']} could not be logged")
    elif kind == "status":
        terminate(client, run_id, record["status"])
    return kind
