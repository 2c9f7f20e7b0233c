"""MLflow client basics shared by the driver, the workers and the spool: where the store is,
how to reach it without long retries, and which MLflow run a run folder records into."""

from __future__ import annotations

import base64
import contextlib
import http.client
import json
import os
import re
import tempfile
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

from trainforge.atomic import replacing
from trainforge.errors import did_you_mean
from trainforge.tracking import new_store

RUN_NAME_TAG = "trainforge.run_name"
DEFAULT_URI = "sqlite:///mlflow.db"
# the schemes MLflow's tracking-store registry serves, less its retired file store
STORE_SCHEMES = ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks",
                 "databricks-uc", "uc")  # fmt: skip
# A down server must cost seconds, not MLflow's default minutes of retries.
CLIENT_ENV = {
    "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1",
    "MLFLOW_HTTP_REQUEST_TIMEOUT": "10",
    # MLflow prints "View run … at <tracking URI>" when a run ends, credentials and all; the
    # closing table names the run with the URI redacted instead
    "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",
    # its bars when a model is logged ("Downloading artifacts"), which the command's console
    # would show where the command logs the model (tracking/relay.py)
    "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false",
}


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
    relay_path: str | None = None
    """Set when the command sends rank 0's records: the file rank 0 writes them to
    (``tracking/relay.py``)."""
    logged_through: int = -1
    """The highest step the run had metrics of when this command reopened it. An earlier
    attempt sent them (up to a checkpoint that was then lost, or was not the one resumed
    from); the steps recomputed since are not sent again: one value per step."""

    def identity(self) -> dict[str, str]:
        """Enough to find or recreate the run later (what the spool records carry). The URI
        without its credentials: the spool is a plain file beside the checkpoints."""
        known = {"run_id": self.run_id} if self.run_id else {}
        return {
            "tracking_uri": redact(self.tracking_uri),
            "experiment": self.experiment,
            "run_name": self.run_name,
        } | known

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


def redact(uri: str) -> str:
    """The URI with its credentials hidden, for anything printed, logged or spooled:
    ``https://user:pass@host`` → ``https://***@host``."""
    scheme, sep, rest = uri.partition("://")
    if not sep:
        return uri
    netloc, slash, path = rest.partition("/")
    if "@" not in netloc:
        return uri
    return f"{scheme}://***@{netloc.rpartition('@')[2]}{slash}{path}"


CREDENTIALS_IN_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def redact_all(text: str) -> str:
    """``text`` (a command line, a log line) with the credentials of every URL in it hidden."""
    return CREDENTIALS_IN_URL.sub(r"\1***@", text)


def uri_problem(uri: str) -> str | None:
    """Why MLflow could not use ``uri`` as a tracking store, or None. Syntax only: whether the
    server answers is decided at run time (training goes on, spooling, when it does not)."""
    scheme, sep, rest = uri.partition("://")
    if not sep or scheme.lower() == "file":
        return (
            "is a folder, and MLflow's file store is gone (MLflow >= 3.13); use "
            "sqlite:///path/to/mlflow.db or a server's http(s)://host:port"
        )
    base = scheme.lower().split("+", 1)[0]  # postgresql+psycopg2: a database and its driver
    if base not in STORE_SCHEMES:
        hint = did_you_mean(base, STORE_SCHEMES)
        return (
            f"has scheme {scheme!r}, which MLflow does not serve{hint}; use http(s)://host:port, "
            "sqlite:///path/to/mlflow.db or a database URI (postgresql://…)"
        )
    host = rest.partition("/")[0].rpartition("@")[2]
    if base in ("http", "https") and not host.strip(":"):
        return "names no host; use http(s)://host:port"
    if base == "sqlite" and not rest.startswith("/"):
        return "needs three slashes and a file: sqlite:///relative.db or sqlite:////abs/path.db"
    return None


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


def open_store(uri: str, ask_server: bool = True) -> None:
    """MLflow imported and the store at ``uri`` opened — a local database's schema made or
    checked — so that a later MLflow call in this process finds both done (MLflow keeps one
    store per URI in a process). ``ask_server`` False: a server is asked nothing, only MLflow
    is imported."""
    configure_client_env()
    from mlflow.tracking import MlflowClient

    if ask_server or not uri.startswith(("http://", "https://")):
        new_store.seed(uri)
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)


def reachable(uri: str, timeout_s: float = 5.0) -> bool:
    """HTTP servers answer /health; local stores (sqlite, file) are always reachable."""
    return health_problem(uri, timeout_s) is None


def run_url(uri: str, run_id: str, timeout_s: float = 2.0) -> str | None:
    """The run's page in the MLflow UI of the server at ``uri``
    (``http://HOST:PORT/#/experiments/<id>/runs/<run>``, without credentials); None for a local
    store, or a server that does not answer within ``timeout_s``."""
    if not uri.startswith(("http://", "https://")) or not reachable(uri, timeout_s):
        return None
    from mlflow.tracking import MlflowClient

    try:
        experiment_id = MlflowClient(tracking_uri=uri).get_run(run_id).info.experiment_id
    except Exception:  # a question for a link: nothing to say when it is not answered
        return None
    scheme, _, rest = uri.partition("://")
    netloc, _, path = rest.partition("/")
    base = f"{scheme}://{netloc.rpartition('@')[2]}/{path}".rstrip("/")
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"


def health_problem(uri: str, timeout_s: float = 5.0) -> str | None:
    """Why the server at ``uri`` does not answer /health from this machine (refused, a name
    that does not resolve, no answer in time, an HTTP status), else None; None for local stores."""
    if not uri.startswith(("http://", "https://")):
        return None
    # urllib cannot open a URL with credentials in it (MLflow's requests can): they go into a
    # basic-auth header instead, as requests would send them
    scheme, _, rest = uri.partition("://")
    userinfo, at, host = rest.partition("@") if "@" in rest.split("/", 1)[0] else ("", "", rest)
    request = urllib.request.Request(f"{scheme}://{host.rstrip('/')}/health")
    if at:
        user, _, password = userinfo.partition(":")
        token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as reply:
            return None if reply.status == 200 else f"/health answered {reply.status}"
    except urllib.error.HTTPError as exc:
        return f"/health answered {exc.code}"
    except urllib.error.URLError as exc:  # refused, unresolved, no route: the socket's reason
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            return f"no answer in {timeout_s:g} s"
        return getattr(reason, "strerror", None) or str(reason)
    except TimeoutError:
        return f"no answer in {timeout_s:g} s"
    except http.client.HTTPException as exc:  # something other than an HTTP server answers
        return f"no HTTP answer: {type(exc).__name__}"
    except (OSError, ValueError) as exc:  # ValueError: a URL urllib cannot parse
        return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


RUNS_FILE = "mlflow-runs.json"
"""In a run's folder: the MLflow run its commands record into, per server and experiment."""


def find_or_create_run(
    client: Any,
    uri: str,
    experiment: str,
    run_name: str,
    folder: Path | None,
    user: str | None = None,
    started_ms: int | None = None,
) -> tuple[str, bool]:
    """(run_id, created): the MLflow run that the commands of the run ``folder`` record into,
    reopened; else a new run, created by ``user`` (its ``user_id``, which the UI's "Created by"
    link searches for) and written down in the folder. A run is not found by its name: the
    same ``run.name`` in another folder (another project, another user of a shared server, a
    run folder removed to start again) is another run, and gets its own. By name only where
    nothing here can keep the record (``folder`` None: the run's storage is remote, s3://…), and
    for folders of an older trainforge (checkpoints, no record), as then. A new run starts at
    ``started_ms`` (the command's start: its MLflow duration is the run's)."""
    experiment_id = _experiment_id(client, uri, experiment)
    key = f"{redact(uri)} {experiment}"
    recorded = _recorded_runs(folder) if folder is not None else {}
    known = recorded.get(key)
    if known is None and (folder is None or any(folder.glob("checkpoint_*"))):
        found = client.search_runs(
            [experiment_id], filter_string=f"tags.`{RUN_NAME_TAG}` = '{run_name}'", max_results=1
        )
        known = found[0].info.run_id if found else None
    created = known is None or not _active(client, known)
    if created:
        tags = {RUN_NAME_TAG: run_name} | ({"mlflow.user": user} if user else {})
        known = client.create_run(
            experiment_id, start_time=started_ms, run_name=run_name, tags=tags
        ).info.run_id
    run_id = str(known)
    if folder is not None and recorded.get(key) != run_id:
        folder.mkdir(parents=True, exist_ok=True)
        with replacing(folder / RUNS_FILE) as temporary:
            temporary.write_text(json.dumps(recorded | {key: run_id}, indent=1) + "\n")
    return run_id, created


EXPERIMENT_KIND = "mlflow.experimentKind"


def _experiment_id(client: Any, uri: str, name: str) -> str:
    """The experiment ``name`` of the store ``uri``, made if need be, and marked as one of
    trained models: MLflow 3's UI otherwise guesses its kind and opens an experiment without
    traces on its GenAI overview, not on its runs."""
    found = client.get_experiment_by_name(name)
    if found is None:
        return _create_experiment(client, uri, name)
    if EXPERIMENT_KIND not in found.tags:  # one made before, or by someone else: unguessed
        client.set_experiment_tag(found.experiment_id, EXPERIMENT_KIND, MODEL_DEVELOPMENT)
    return str(found.experiment_id)


MODEL_DEVELOPMENT = "custom_model_development"  # MLflow 3's kind for a model-training project
ARTIFACTS_FOLDER = "mlruns"
"""Beside a SQLite store: its experiments' artifacts, ``mlruns/<experiment id>/``."""


def _create_experiment(client: Any, uri: str, name: str) -> str:
    """A new experiment; a SQLite store's keeps its artifacts (models, plots) in
    ``mlruns/<experiment id>`` beside the database. MLflow's default root is ``./mlruns`` of
    the working directory: a store named elsewhere got them wherever its first command ran,
    where a command from another folder, or the UI, could not find them. For the embedded
    ``./mlflow.db`` both are the same folder. A server's experiments keep its own root."""
    tags = {EXPERIMENT_KIND: MODEL_DEVELOPMENT}
    database = new_store.sqlite_file(uri)
    if database is None:
        return str(client.create_experiment(name, tags=tags))
    from mlflow.entities import ExperimentTag
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    # MLflow's own store with that root makes the experiment, so that its folder is named by
    # the id it is given, as MLflow's default is; the store shares the client's engine
    store = SqlAlchemyStore(uri, str(database.resolve().parent / ARTIFACTS_FOLDER))
    made = store.create_experiment(name, tags=[ExperimentTag(k, v) for k, v in tags.items()])
    return str(made)


def runs_view(uri: str, experiment: str, served_at: str) -> str:
    """Where the MLflow UI at ``served_at`` shows the runs of ``experiment`` in the store
    ``uri`` (its runs view, the experiment marked so that the UI stays there); the UI's list of
    experiments where the store has no such experiment or cannot be read."""
    from mlflow.tracking import MlflowClient

    try:
        client = MlflowClient(tracking_uri=uri)
        if client.get_experiment_by_name(experiment) is None:
            return served_at
        return f"{served_at}/#/experiments/{_experiment_id(client, uri, experiment)}/runs"
    except Exception:  # a question for a link: the UI itself shows what is wrong
        return served_at


def _recorded_runs(folder: Path) -> dict[str, str]:
    try:
        recorded = json.loads((folder / RUNS_FILE).read_text())
    except (OSError, ValueError):  # none yet; or unreadable: a new run, never a wrong one
        return {}
    return recorded if isinstance(recorded, dict) else {}


def _active(client: Any, run_id: str) -> bool:
    """The run still exists and is not deleted (a run deleted in the UI is not reopened)."""
    from mlflow.exceptions import MlflowException

    try:
        return bool(client.get_run(run_id).info.lifecycle_stage == "active")
    except MlflowException:  # no such run on this server
        return False


FAILURE_TAG = "trainforge.failure"


def terminate(client: Any, run_id: str, status: str) -> None:
    """End the run, with its learning curve (``plots/learning_curve.svg``), live or from the
    spool alike; one that ends FINISHED (resumed after a failed attempt) no longer carries
    that attempt's failure."""
    from mlflow.exceptions import MlflowException

    log_learning_curve(client, run_id)
    if status == "FINISHED":
        with contextlib.suppress(MlflowException):  # raised where it never failed
            client.delete_tag(run_id, FAILURE_TAG)
    client.set_terminated(run_id, status=status)


def last_logged_step(client: Any, run_id: str) -> int:
    """The highest step of the run's training metrics (-1: none); the system metrics count
    their own samples."""
    keys = [key for key in client.get_run(run_id).data.metrics if not key.startswith("system/")]
    steps = (m.step for key in keys for m in client.get_metric_history(run_id, key))
    return max(steps, default=-1)


RUN_EVENTS = frozenset({"run/restarts"})
"""Metrics that count the run's own events at the step they happened, not a step's results: no
resume redoes them, so none is left out as already logged."""


def after(rows: list[Any], logged_through: int) -> list[Any]:
    """Metric rows (key, value, timestamp, step) of steps the run has no metrics of yet, and
    every row of the run's events (``RUN_EVENTS``)."""
    if logged_through < 0:
        return rows
    return [row for row in rows if row[3] > logged_through or row[0] in RUN_EVENTS]


def log_learning_curve(client: Any, run_id: str) -> None:
    from trainforge.plots import learning_curve

    history = {
        key: [(m.step, m.value) for m in client.get_metric_history(run_id, key)]
        for key in ("train/loss", "val/loss", "val/accuracy")
    }
    if not any(history.values()):
        return
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "learning_curve.svg"
        learning_curve(history, path)
        client.log_artifact(run_id, str(path), "plots")
