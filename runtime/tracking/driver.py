"""MLflow tracking, driver side: the run's lifecycle, params, tags and closing artifacts.

The run is found again by its run name (tag ``trainforge.run_name``), so a Ray Train restart, a
resubmitted job or a KubeRay retry continues the same MLflow run. Tracking problems never stop
training: the driver reports them once and spools what it could not send (``tracking/spool.py``).
Rank 0 logs the training metrics (``tracking/worker.py``).
"""

from __future__ import annotations

import getpass
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from trainforge import log, settings, storage
from trainforge.log import first_line, warn
from trainforge.tracking import new_store
from trainforge.tracking.client import (
    FAILURE_TAG,
    RunHandle,
    configure_client_env,
    find_or_create_run,
    flatten,
    last_logged_step,
    reachable,
    redact,
    redact_all,
    resolve_uri,
    terminate,
)
from trainforge.tracking.spool import Spool

# a value that names a place on one machine: a tag, not a param (params compare across runs)
MACHINE_PATH = re.compile(r"^(/|~|[A-Za-z]:[\\/]|file:|sqlite:)")


def _installed(*distributions: str) -> str:
    """The version of the first of ``distributions`` installed (MLflow may come as
    ``mlflow-skinny`` alone)."""
    from importlib.metadata import PackageNotFoundError, version

    for name in distributions:
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return "unknown"


def driver_tags() -> dict[str, str]:
    """Facts the driver knows: code version, job identity, library versions (from the
    installed packages' metadata: importing torch and mlflow for them costs seconds)."""
    import ray

    from trainforge import __version__

    tags = {
        "trainforge.version": __version__,
        "version.torch": _installed("torch"),
        "version.ray": ray.__version__,
        "version.mlflow": _installed("mlflow", "mlflow-skinny"),
        "python": sys.version.split()[0],
    }
    job_config = json.loads(os.environ.get("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}") or "{}")
    submission_id = job_config.get("metadata", {}).get("job_submission_id")
    if submission_id:
        tags["ray.submission_id"] = submission_id
    if ray.is_initialized():
        tags["ray.job_id"] = ray.get_runtime_context().get_job_id()
    if settings.PARENT_RUN.is_set():  # MLflow's UI nests the run under this one
        tags["mlflow.parentRunId"] = settings.PARENT_RUN.get()
    return tags | source_tags(submitted=submission_id is not None)


_invoked: list[str] = []


def invoked_as(argv: list[str]) -> None:
    """The command line, as the CLI was called (its ``argv`` is not ``sys.argv`` when it is
    called in-process)."""
    _invoked[:] = argv


def source_tags(submitted: bool, argv: list[str] | None = None) -> dict[str, str]:
    """MLflow's own run-context tags, which its UI shows as Source, User and Git commit, and
    the run's description: the command line and the recipe it trained."""
    command, recipe = invocation(argv or _invoked or sys.argv)
    tags = {
        "mlflow.source.name": recipe or command.split(" ", 2)[0],
        "mlflow.source.type": "JOB" if submitted else "LOCAL",
        "mlflow.user": settings.USER.get() or submitter(),
        "mlflow.note.content": f"`{command}`" + (f"\n\nRecipe: `{recipe}`" if recipe else ""),
    }
    commit = settings.GIT_COMMIT.get() or git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
        tags["git.commit"] = commit  # the name earlier runs were tagged with
    return tags


def invocation(argv: list[str]) -> tuple[str, str | None]:
    """(the command line as typed, the recipe it names) from the process's arguments: the
    ``trainforge`` console script and ``python -m trainforge`` read the same."""
    program = Path(argv[0]).name if argv else "python"
    args = list(argv[1:])
    recipe = None
    if program == "trainforge" or Path(argv[0]).parent.name in ("trainforge", "runtime"):
        program = "trainforge"  # python -m trainforge: argv[0] is the package's __main__.py
        if args and args[0] in ("train", "simulate"):
            recipe = _first_positional(args[1:])
    return redact_all(shlex.join([program, *args])), recipe


def _first_positional(args: list[str]) -> str | None:
    """The recipe among a `train` or `simulate` command's arguments: the first that is not
    one of their flags (``-q``, ``--verbose``; none takes a value), or the one after ``--``."""
    for position, arg in enumerate(args):
        if arg == "--":
            return args[position + 1] if position + 1 < len(args) else None
        if not arg.startswith("-"):
            return arg
    return None


def submitter() -> str:
    """This machine's login name, as MLflow itself records ``mlflow.user``."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # a container user without a passwd entry
        return "unknown"


def split_params(params: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(params, tags): values that name a place on this machine (absolute paths, sqlite and
    file URIs) become tags under the same key, so params compare across machines."""
    kept = {k: v for k, v in params.items() if not MACHINE_PATH.match(v)}
    return kept, {k: v for k, v in params.items() if k not in kept}


def git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def start_run(
    section: Any,
    run_name: str,
    recipe: dict[str, Any],
    recipe_yaml: str,
    spool_path: str,
    tags: dict[str, str] | None = None,
    uri: str | None = None,
    started: float | None = None,
) -> RunHandle:
    """Create the MLflow run for ``run_name`` or reopen it; offline (spooling) when the server
    cannot be reached. ``tags``: ``driver_tags()``, ``uri``: the store as the command resolved
    it (``client.resolve_uri``), and ``started``: the command's start (``log.STARTED_AT``), the
    new run's start time, taken in the driver when this runs in another process (a warm
    worker, ``driver/warm_pool.py``, started by an earlier command: its own folder,
    environment and start are not this command's)."""
    from mlflow.entities import Param
    from mlflow.tracking import MlflowClient

    configure_client_env()
    uri = uri or resolve_uri(section.tracking_uri)
    handle = RunHandle(uri, section.experiment, run_name, None, False, spool_path)
    recipe_yaml = redact_all(recipe_yaml)  # credentials stay out of params and artifacts
    params, path_tags = split_params(
        {k: redact(v) if k == "tracking.tracking_uri" else v for k, v in flatten(recipe).items()}
    )
    tags = (driver_tags() if tags is None else tags) | path_tags
    try:
        if not reachable(uri):
            raise ConnectionError(f"{redact(uri)}/health did not answer")
        new_store.seed(uri)  # a new SQLite store without MLflow's migrations
        client = MlflowClient(tracking_uri=uri)
        user = tags["mlflow.user"]
        # the run's folder, where it is on this machine (not for s3://…: its spool's is not
        # the run's, a later command of it may run elsewhere)
        remote = storage.is_uri(str(recipe.get("run", {}).get("storage_path", "")))
        folder = None if remote else Path(spool_path).parent
        started_ms = int(1000 * (log.STARTED_AT if started is None else started))
        run_id, created = find_or_create_run(
            client, uri, section.experiment, run_name, folder, user, started_ms
        )
        handle.run_id, handle.resumed = run_id, not created
        if created:
            items = [Param(k, v) for k, v in params.items()]
            for start in range(0, len(items), 100):
                client.log_batch(run_id, params=items[start : start + 100])
            client.log_text(run_id, recipe_yaml, "recipe.yaml")
        else:
            client.update_run(run_id, status="RUNNING")
            tags |= resumed_changes(client, run_id, params)
            handle.logged_through = last_logged_step(client, run_id)
        for key, value in tags.items():
            client.set_tag(run_id, key, value)
    except Exception as exc:
        warn(
            f"MLflow at {redact(uri)} {not_reached(exc, section.experiment)}; training goes on "
            f"and the run is kept in {spool_path} — replay it with `trainforge tracking-sync "
            f"{Path(spool_path).parent}`"
        )
        handle.run_id = None
        spool = Spool.of(handle)
        spool.write("params", params=params)
        spool.write("text", text=recipe_yaml, artifact_file="recipe.yaml")
        spool.write("tags", tags=tags)
    return handle


CREDENTIALS = (
    "the user and password in tracking.tracking_uri (http://user:password@host) or in "
    "MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD"
)


def not_reached(exc: BaseException, experiment: str) -> str:
    """Why the run could not be made, in the words a user acts on. A server that refuses the
    credentials (basic auth: 401) or the user (403) answers: it is not called unreachable, and
    what to fix is named."""
    status = getattr(exc, "get_http_status_code", None)  # MLflow's errors carry the HTTP status
    code = status() if callable(status) else None
    if code == 401:
        return f"refused the credentials (401, not authenticated): check {CREDENTIALS}"
    if code == 403:
        return (
            f"refused the user access to experiment '{experiment}' (403, permission denied): "
            "give the user permission to edit it, or set tracking.experiment to one it may edit"
        )
    return f"is unreachable ({redact_all(first_line(exc))})"


def resumed_changes(client: Any, run_id: str, params: dict[str, str]) -> dict[str, str]:
    """A run resumed with a changed recipe (``checkpoint.allow_changes``): MLflow keeps a
    param's first value for good, so each change becomes a tag, ``trainforge.changed.<key>``
    = ``old -> new``, beside the param; keys the run did not have yet become params."""
    from mlflow.entities import Param

    run = client.get_run(run_id).data
    logged = run.params
    added = [Param(k, v) for k, v in params.items() if k not in logged]
    for start in range(0, len(added), 100):
        client.log_batch(run_id, params=added[start : start + 100])
    changed = {
        f"{CHANGED_TAG}{key}": f"{logged[key]} -> {value}"
        for key, value in params.items()
        if key in logged and logged[key] != value
    }
    for stale in [tag for tag in run.tags if tag.startswith(CHANGED_TAG) and tag not in changed]:
        client.delete_tag(run_id, stale)  # changed back since
    return changed


CHANGED_TAG = "trainforge.changed."


def finish_run(
    handle: RunHandle, status: str, checkpoint_path: str | None, reason: str | None = None
) -> None:
    """Closing facts (learning curve, checkpoint pointer, why it failed) and the final status."""
    from mlflow.tracking import MlflowClient

    tags = {"trainforge.last_checkpoint": checkpoint_path} if checkpoint_path else {}
    if reason:
        tags[FAILURE_TAG] = reason[:5000]
    if handle.run_id is not None:
        try:
            client = MlflowClient(tracking_uri=handle.tracking_uri)
            for key, value in tags.items():
                client.set_tag(handle.run_id, key, value)
            terminate(client, handle.run_id, status)
            return
        except Exception as exc:
            warn(f"could not close the MLflow run ({first_line(exc)}); kept in {handle.spool_path}")
    spool = Spool.of(handle)
    if tags:
        spool.write("tags", tags=tags)
    spool.write("status", status=status)
