"""A real `mlflow server` on 127.0.0.1 for the tests: SQLite backend, artifacts served."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class MlflowServer:
    def __init__(self, root: Path, port: int | None = None) -> None:
        self.root = root
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 90) -> MlflowServer:
        self.root.mkdir(parents=True, exist_ok=True)
        mlflow_cli = shutil.which("mlflow") or os.path.join(
            os.path.dirname(sys.executable), "mlflow"
        )
        self.log = (self.root / "server.log").open("ab")
        self.process = subprocess.Popen(
            [mlflow_cli, "server", "--host", "127.0.0.1", "--port", str(self.port),
             "--backend-store-uri", f"sqlite:///{self.root / 'mlflow.db'}",
             "--serve-artifacts", "--artifacts-destination", str(self.root / "artifacts"),
             "--workers", "1"],
            stdout=self.log, stderr=subprocess.STDOUT,
            env={**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"},
        )  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"mlflow server exited: {(self.root / 'server.log').read_text()}"
                )
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
