"""Ctrl-C and SIGTERM while a `trainforge train` command starts: one line, exit 130 (143 for
SIGTERM), no Python traceback and no stack dump from Ray's core (which installs its own SIGTERM
handler)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import RECIPES

DIGITS = RECIPES / "cnn" / "digits_simple_cnn.yaml"


pytestmark = pytest.mark.ray


def start(tmp_path: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "TRAINFORGE_WORKERS": "own"}
    env.pop("RAY_ADDRESS", None)
    return subprocess.Popen(
        [sys.executable, "-m", "trainforge", "train", str(DIGITS), "run.name=stopped",
         "train.epochs=50"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        # as from a terminal: an xdist worker ignores SIGINT, and a child inherits that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


def quiet_end(output: str) -> None:
    lines = [line for line in output.splitlines() if line.strip()]
    assert lines[-1].startswith(("[trainforge] interrupted;", "[trainforge] terminated;")), lines
    assert "Traceback" not in output and "KeyboardInterrupt" not in output
    assert "logging.cc" not in output  # Ray core's stack dump on SIGTERM


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_stop_while_ray_starts_ends_with_one_line(tmp_path: Path, stop: signal.Signals) -> None:
    process = start(tmp_path)
    assert process.stdout is not None
    seen = []
    for line in process.stdout:  # once Ray is up: its handlers are installed by then
        seen.append(line)
        if line.startswith("[trainforge] ray: "):
            break
    process.send_signal(stop)
    rest, _ = process.communicate(timeout=120)
    assert process.returncode == (130 if stop == signal.SIGINT else 143), "".join(seen) + rest
    quiet_end("".join(seen) + rest)


def test_a_ctrl_c_during_the_imports_ends_with_one_line(tmp_path: Path) -> None:
    process = start(tmp_path)
    time.sleep(1.0)  # Python is up and importing; the first line comes after ~2.5 s
    process.send_signal(signal.SIGINT)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 130, output
    quiet_end(output)


class SlowMlflow:
    """An MLflow server stand-in on 127.0.0.1 that answers ``/health`` and holds every other
    request ``hold_s`` before a 503: a tracking server that takes seconds to make a run."""

    def __init__(self, hold_s: float) -> None:
        import http.server
        import threading

        outer = self
        self.released_at: float | None = None

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.startswith("/health"):
                    self._answer(200, b"OK")
                else:
                    self._hold()

            def do_POST(self) -> None:
                self._hold()

            def _hold(self) -> None:
                time.sleep(hold_s)
                outer.released_at = outer.released_at or time.monotonic()
                self._answer(503, b"busy")

            def _answer(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.uri = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def test_a_ctrl_c_says_so_at_once_while_the_mlflow_run_is_still_being_made(
    tmp_path: Path,
) -> None:
    """A cold command trains on its own workers while a thread makes the MLflow run; a Ctrl-C
    then says its one line at once, not after the run's making (up to MLflow's timeouts), and
    the run still ends KILLED (here: in the spool, as the server never made it). No `mlflow:`
    phase line comes after the interruption's."""
    server = SlowMlflow(hold_s=10.0)
    env = {**os.environ, "TRAINFORGE_HOME": str(tmp_path / "home"),
           "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "0", "MLFLOW_HTTP_REQUEST_TIMEOUT": "30"}  # fmt: skip
    for key in ("RAY_ADDRESS", "TRAINFORGE_WORKERS"):
        env.pop(key, None)  # a user's command: none of the test session's settings (conftest)
    process = subprocess.Popen(
        [sys.executable, "-m", "trainforge", "train", str(DIGITS), "run.name=slow",
         "train.epochs=50", "scaling.num_workers=1", f"tracking.tracking_uri={server.uri}"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    assert process.stdout is not None
    seen = []
    for line in process.stdout:  # the workers' run is under way
        seen.append(line)
        if "process group up" in line:
            break
    assert server.released_at is None, "".join(seen)  # the run's making still waits
    process.send_signal(signal.SIGINT)
    after = []
    for line in process.stdout:
        after.append((time.monotonic(), line))
    assert process.wait(timeout=120) == 130, "".join(seen) + "".join(line for _, line in after)
    said = [(at, line) for at, line in after if line.startswith("[trainforge] interrupted;")]
    assert len(said) == 1, after
    assert server.released_at is not None and said[0][0] < server.released_at, after
    lines = [line for _, line in after]
    assert not any(line.startswith("[trainforge] mlflow:") for line in seen + lines), lines
    assert "Traceback" not in "".join(lines)
    spool = (tmp_path / "runs" / "slow").glob("*spool*")
    assert any('"KILLED"' in path.read_text() for path in spool), lines
