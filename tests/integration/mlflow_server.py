"""A real `mlflow server` on 127.0.0.1 for the tests: SQLite backend, artifacts served; with
``credentials``, MLflow's basic-auth app in front (``mlflow server --app-name basic-auth``: every
request but /health needs that user's password)."""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def answers(url: str) -> bool:
    """Whether ``url`` answers 200 now: one short request (a client's own retries back off for
    minutes while a server starts)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


class MlflowServer:
    def __init__(self, root: Path, credentials: tuple[str, str] | None = None) -> None:
        self.root = root
        self.credentials = credentials
        """The (user, password) of the server's one user, its admin, where it requires basic
        auth."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    @property
    def authenticated_url(self) -> str:
        """The URL with the user's credentials in it, as ``tracking_uri`` takes them."""
        if self.credentials is None:
            return self.url
        user, password = self.credentials
        return f"http://{user}:{password}@127.0.0.1:{self.port}"

    def _auth(self) -> tuple[list[str], dict[str, str]]:
        """The basic-auth app's arguments and environment. MLflow 3.17 ships no admin password:
        the app makes its admin from MLFLOW_AUTH_ADMIN_USERNAME/PASSWORD on its first start, and
        needs a static key for its CSRF protection. The password stays out of the config file
        (the secrets test searches the server's folder for it); the user store, beside the
        runs', keeps only its hash."""
        if self.credentials is None:
            return [], {}
        user, password = self.credentials
        config = self.root / "basic_auth.ini"
        config.write_text(
            "[mlflow]\ndefault_permission = READ\n"
            f"database_uri = sqlite:///{self.root / 'basic_auth.db'}\n"
            "authorization_function = mlflow.server.auth:authenticate_request_basic_auth\n"
            # a credential checked once a minute, not at each of a run's ~100 requests (a
            # scrypt hash, 0.1 s of this machine's CPU each); a wrong one is never kept
            "auth_cache_ttl_seconds = 60\n"
        )
        return ["--app-name", "basic-auth"], {
            "MLFLOW_AUTH_CONFIG_PATH": str(config),
            "MLFLOW_AUTH_ADMIN_USERNAME": user,
            "MLFLOW_AUTH_ADMIN_PASSWORD": password,
            "MLFLOW_FLASK_SERVER_SECRET_KEY": secrets.token_hex(16),
        }

    def start(self, timeout_s: float = 90, attempts: int = 3) -> MlflowServer:
        """The server, answering /health. Its port was free when picked, but another process
        of the suite may bind it first (Ray's agents and workers take ports all the time): the
        server then exits with "address already in use" and starts again on a new port."""
        for attempt in range(1, attempts + 1):
            try:
                return self._start(timeout_s)
            except RuntimeError as exc:
                if attempt == attempts or "already in use" not in str(exc).lower():
                    raise
                self.port = free_port()
                self.url = f"http://127.0.0.1:{self.port}"
        raise AssertionError("unreachable")

    def _start(self, timeout_s: float) -> MlflowServer:
        self.root.mkdir(parents=True, exist_ok=True)
        mlflow_cli = shutil.which("mlflow") or os.path.join(
            os.path.dirname(sys.executable), "mlflow"
        )
        log_path = self.root / "server.log"
        log_start = log_path.stat().st_size if log_path.is_file() else 0
        auth_args, auth_env = self._auth()
        with log_path.open("ab") as log:  # the server writes to its own copy of the file
            self.process = subprocess.Popen(
                [mlflow_cli, "server", "--host", "127.0.0.1", "--port", str(self.port),
                 "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
                 "--serve-artifacts", "--artifacts-destination", str(self.root / "artifacts"),
                 "--workers", "1", *auth_args],
                stdout=log, stderr=subprocess.STDOUT,
                # no job runner (eight more processes and ~23 CPU-seconds at each start, for
                # MLflow's GenAI jobs): `trainforge ui` starts its server without it too
                env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true",
                     "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **auth_env},
            )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                with log_path.open("rb") as log:  # this start's lines only
                    log.seek(log_start)
                    said = log.read().decode(errors="replace")
                raise RuntimeError(f"mlflow server exited: {said}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as reply:
                    if reply.status == 200:
                        return self
            except OSError:
                time.sleep(0.3)
        self.stop()
        raise TimeoutError(f"mlflow server did not answer /health within {timeout_s} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None


def recorded(client: Any, run: Any, varying: tuple[str, ...] = ()) -> dict[str, Any]:
    """What a run holds, key by key, less what differs between two runs of one recipe (its
    name, the store's address, times, the machine's load) and the params under ``varying``."""
    run_id = run.info.run_id

    def files(path: str | None = None) -> list[str]:
        found = []
        for entry in client.list_artifacts(run_id, path):
            found += files(entry.path) if entry.is_dir else [entry.path]
        return sorted(found)

    varying = ("run.name", "tracking.tracking_uri", *varying)
    models = client.search_logged_models([run.info.experiment_id])
    return {
        "status": run.info.status,
        "params": {k: v for k, v in run.data.params.items() if not k.startswith(varying)},
        "metric steps": {key: [m.step for m in client.get_metric_history(run_id, key)]
                         for key in run.data.metrics if not key.startswith(("system/", "perf/"))},
        "tags": sorted(k for k in run.data.tags if not k.startswith("mlflow.log-model")),
        "artifacts": files(),
        "logged models": [m.name for m in models if m.source_run_id == run_id],
        "dataset inputs": [d.dataset.name for d in client.get_run(run_id).inputs.dataset_inputs],
    }  # fmt: skip
