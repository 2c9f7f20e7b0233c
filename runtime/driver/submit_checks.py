"""What `trainforge submit` checks before submitting: that the job's run is kept.

A submitted job runs on a node of the cluster, in Ray's temporary copy of the project (its
working_dir), which Ray deletes with the job. A relative ``run.storage_path`` or SQLite store
resolves there, so checkpoints, spool and runs would vanish while the job reports success;
an MLflow server the job cannot reach leaves the run only in its spool.

This machine can only ask whether a server answers *from here*. A cluster that this machine
submits to usually reaches what this machine reaches; a server that only the cluster's
nodes reach is either a Kubernetes service name (never asked: it resolves only inside the
cluster) or is vouched for with ``--trust-cluster``, which skips these checks.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from trainforge import storage
from trainforge.config.schema import Recipe
from trainforge.errors import RecipeError
from trainforge.tracking.client import DEFAULT_URI, health_problem, redact, uri_problem

URI_ENV = "MLFLOW_TRACKING_URI"
KUBERNETES_SUFFIXES = (".svc", ".svc.cluster.local")
"""Host names of Kubernetes services (``mlflow.trainforge.svc``), which resolve only in-cluster."""
HEALTH_TIMEOUT_S = 5.0
SERVER_HINT = "an MLflow server the cluster's nodes reach (http://HOST:5000)"
SHARED_SQLITE_HINT = "sqlite:////SHARED/PATH/mlflow.db on storage the nodes share"
TRUST_HINT = "--trust-cluster if the cluster keeps the run otherwise"


def check_kept(
    cfg: Recipe, env_vars: dict[str, str], env_file: Path | None, ship: bool, trust: bool
) -> None:
    """Refuse, in one line naming every setting at fault, a job whose run would not be kept.

    ``env_vars``: the job's runtime env variables; ``env_file``: the runtime env file they came
    from; ``ship``: whether the project ships as the job's working_dir; ``trust``: the user
    vouches for the cluster (``--trust-cluster``): only a malformed tracking URI is refused."""
    tracking = job_tracking_uri(cfg, env_vars, env_file)
    if trust:
        return
    where = (
        "Ray's temporary copy of the working_dir, deleted with the job"
        if ship
        else "the folder the cluster runs the job in, on whichever node that is"
    )
    problems = [
        problem
        for problem in (
            storage_problem(cfg.run.storage_path, where),
            tracking_problem(tracking, where) if cfg.tracking.enabled else None,
        )
        if problem
    ]
    if problems:
        raise RecipeError("; ".join(problems) + f" ({TRUST_HINT})")


def job_tracking_uri(
    cfg: Recipe, env_vars: dict[str, str], env_file: Path | None
) -> tuple[str, str] | None:
    """The job's tracking URI as its trainforge resolves it — the recipe's, else
    $MLFLOW_TRACKING_URI of its runtime env — and where it is set; None where neither sets one
    (the cluster's own environment decides). A malformed one in the runtime env is refused: the
    recipe's was checked with the recipe."""
    if cfg.tracking.tracking_uri:
        return cfg.tracking.tracking_uri, "tracking.tracking_uri"
    uri = env_vars.get(URI_ENV)
    if not uri:
        return None
    source = f"{URI_ENV} in {env_file or 'the runtime env'}"
    problem = uri_problem(uri)
    if problem:
        raise RecipeError(f"{source}: {redact(uri)!r} {problem}")
    return uri, source


def storage_problem(location: str, where: str) -> str | None:
    """A relative run folder resolves in the job's own folder; a URI (s3://…), an absolute
    path or ``~`` (the home on the cluster's node) does not."""
    if storage.is_uri(location) or location.startswith("~") or Path(location).is_absolute():
        return None
    return (
        f"run.storage_path {location!r} is relative: the job's checkpoints would land in "
        f"{where}; set run.storage_path=/ABSOLUTE/PATH on storage the cluster's nodes share"
    )


def tracking_problem(tracking: tuple[str, str] | None, where: str) -> str | None:
    """Why the job's tracking store would not keep its run, or None."""
    if tracking is None:
        return (
            f"no MLflow store is set for the job (tracking.tracking_uri, or {URI_ENV} in "
            f"--runtime-env): it would record into {DEFAULT_URI} in {where}; set "
            f"tracking.tracking_uri to {SERVER_HINT} or {SHARED_SQLITE_HINT}"
        )
    uri, source = tracking
    shown = redact(uri)
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        return (
            f"{source} {shown!r} is a relative SQLite file: it would land in {where}; set "
            f"{SERVER_HINT} or {SHARED_SQLITE_HINT}"
        )
    parts = urlsplit(uri)
    host = (parts.hostname or "").rstrip(".")
    if parts.scheme.lower() not in ("http", "https") or host.endswith(KUBERNETES_SUFFIXES):
        return None  # a database or a cluster-internal name: nothing to ask from here
    reason = health_problem(uri, HEALTH_TIMEOUT_S)
    if reason is None:
        return None
    return (
        f"{source} {shown} does not answer from this machine ({reason}), the only place "
        "submit can ask from; the job's driver and rank 0 send the run to it from the cluster's "
        f"nodes: start it, or set {SERVER_HINT} or {SHARED_SQLITE_HINT}"
    )
