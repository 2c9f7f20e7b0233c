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


pytestmark = pytest.mark.ray  # with the other tests that start a Ray: no port races


def start(tmp_path: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "TRAINFORGE_KEEP_CLUSTER": "0"}
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
