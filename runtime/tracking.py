"""MLflow tracking, driver side: the run's lifecycle, params, tags and closing artifacts.

The run is found again by its run name (tag ``trainforge.run_name``), so a Ray Train restart, a
resubmitted job or a KubeRay retry continues the same MLflow run. Tracking problems never stop
training: the driver reports them once and spools what it could not send (``tracking_spool``).
Rank 0 logs the training metrics (``tracking_worker``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runtime.tracking_spool import Spool

RUN_NAME_TAG = "trainforge.run_name"
DEFAULT_URI = "sqlite:///mlflow.db"
GIT_COMMIT_ENV = (
    "TRAINFORGE_GIT_COMMIT"  # set by the job submitter when the tree ships without .git
)
# A down server must cost seconds, not MLflow's default minutes of retries.
CLIENT_ENV = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_TIMEOUT": "10"}


@dataclass
class RunHandle:
    """How the workers reach the run. ``run_id`` is None when the server was unreachable at
    start: everything then goes to the spool."""

    tracking_uri: str
    experiment: str
    run_name: str
    run_id: str | None
    resumed: bool
    spool_path: str

    def spool(self) -> Spool:
        return Spool(
            self.spool_path,
            {"tracking_uri": self.tracking_uri, "experiment": self.experiment,
             "run_name": self.run_name},
        )  # fmt: skip

    def for_workers(self) -> dict[str, Any]:
        return dict(self.__dict__)


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


def configure_client_env() -> None:
    for key, value in CLIENT_ENV.items():
        os.environ.setdefault(key, value)


def reachable(uri: str, timeout_s: float = 5.0) -> bool:
    """HTTP servers answer /health; local stores (sqlite, file) are always reachable."""
    if not uri.startswith(("http://", "https://")):
        return True
    try:
        with urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=timeout_s) as reply:
            return reply.status == 200
    except OSError:
        return False


def find_or_create_run(client: Any, experiment: str, run_name: str) -> tuple[str, bool]:
    """(run_id, created) of the run tagged with ``run_name`` in ``experiment``."""
    found_experiment = client.get_experiment_by_name(experiment)
    experiment_id = (
        found_experiment.experiment_id if found_experiment else client.create_experiment(experiment)
    )
    found = client.search_runs(
        [experiment_id], filter_string=f"tags.`{RUN_NAME_TAG}` = '{run_name}'", max_results=1
    )
    if found:
        return found[0].info.run_id, False
    run = client.create_run(experiment_id, run_name=run_name, tags={RUN_NAME_TAG: run_name})
    return run.info.run_id, True


def driver_tags() -> dict[str, str]:
    """Facts the driver knows: code version, job identity, library versions."""
    import mlflow
    import ray
    import torch

    from runtime import __version__

    tags = {
        "trainforge.version": __version__,
        "version.torch": torch.__version__,
        "version.ray": ray.__version__,
        "version.mlflow": mlflow.__version__,
        "python": sys.version.split()[0],
    }
    commit = os.environ.get(GIT_COMMIT_ENV) or git_commit()
    if commit:
        tags["git.commit"] = commit
    job_config = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}") or "{}")
    submission_id = job_config.get("metadata", {}).get("job_submission_id")
    if submission_id:
        tags["ray.submission_id"] = submission_id
    if ray.is_initialized():
        tags["ray.job_id"] = ray.get_runtime_context().get_job_id()
    return tags


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def start_run(
    section: Any, run_name: str, recipe: dict[str, Any], recipe_yaml: str, spool_path: str
) -> RunHandle:
    """Create the MLflow run for ``run_name`` or reopen it; offline (spooling) when the server
    cannot be reached."""
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    configure_client_env()
    uri = resolve_uri(section.tracking_uri)
    handle = RunHandle(uri, section.experiment, run_name, None, False, spool_path)
    params = flatten(recipe)
    tags = driver_tags()
    try:
        if not reachable(uri):
            raise ConnectionError(f"{uri}/health did not answer")
        client = MlflowClient(tracking_uri=uri)
        run_id, created = find_or_create_run(client, section.experiment, run_name)
        handle.run_id, handle.resumed = run_id, not created
        if created:
            items = [Param(k, v) for k, v in params.items()]
            for start in range(0, len(items), 100):
                client.log_batch(run_id, params=items[start : start + 100])
            client.log_text(run_id, recipe_yaml, "recipe.yaml")
        else:
            client.update_run(run_id, status="RUNNING")
        for key, value in tags.items():
            client.set_tag(run_id, key, value)
    except Exception as exc:
        warn(
            f"MLflow at {uri} is unreachable ({_short(exc)}); training goes on and the run is "
            f"kept in {spool_path} — replay it with `trainforge tracking-sync "
            f"{Path(spool_path).parent}`"
        )
        handle.run_id = None
        spool = handle.spool()
        spool.write("params", params=params)
        spool.write("text", text=recipe_yaml, artifact_file="recipe.yaml")
        spool.write("tags", tags=tags)
    return handle


def finish_run(handle: RunHandle, status: str, checkpoint_path: str | None) -> None:
    """Closing facts (learning curve, checkpoint pointer) and the final status."""
    from mlflow.tracking import MlflowClient

    tags = {"trainforge.last_checkpoint": checkpoint_path} if checkpoint_path else {}
    if handle.run_id is not None:
        try:
            client = MlflowClient(tracking_uri=handle.tracking_uri)
            for key, value in tags.items():
                client.set_tag(handle.run_id, key, value)
            log_learning_curve(client, handle.run_id)
            client.set_terminated(handle.run_id, status=status)
            return
        except Exception as exc:
            warn(f"could not close the MLflow run ({_short(exc)}); kept in {handle.spool_path}")
    spool = handle.spool()
    if tags:
        spool.write("tags", tags=tags)
    spool.write("status", status=status)


def log_learning_curve(client: Any, run_id: str) -> None:
    import tempfile

    from runtime.plots import learning_curve

    history = {
        key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
        for key in ("train/loss", "val/loss", "val/accuracy")
    }
    if not any(history.values()):
        return
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "learning_curve.png"
        learning_curve(history, path)
        client.log_artifact(run_id, str(path), "plots")


_warned: set[str] = set()


def warn(message: str, key: str | None = None) -> None:
    """Say a tracking problem once (per ``key``, default the message), not once per step."""
    key = key or message
    if key in _warned:
        return
    _warned.add(key)
    sys.stderr.write(f"[trainforge] warning: {message}\n")
    sys.stderr.flush()


def _short(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]
