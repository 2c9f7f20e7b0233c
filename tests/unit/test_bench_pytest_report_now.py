"""bench/pytest_report_now.py, the plugin the device steps run the GPU tests with: a failure's
report is on disk as soon as the test fails, and every thread's stack is written at the
deadline even after a failure (pytest's own faulthandler plugin cancels pending dumps there),
so a session that the step's limit ends still says why."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TESTS = """
import time

def test_fails():
    assert 1 == 2, "the reason it failed"

def test_hangs():
    time.sleep(120)
"""
STACKS_AFTER_S = 12
"""After pytest's start: its start-up and collection took over 3 s on two loaded cores, and a
dump before test_hangs shows none of its frames."""


def test_a_failure_and_the_stacks_are_written_before_the_session_ends(tmp_path: Path) -> None:
    (tmp_path / "test_example.py").write_text(TESTS)
    out = tmp_path / "out"
    out.mkdir()
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OUT": str(out), "STACKS_AFTER_S": str(STACKS_AFTER_S), "PYTHONPATH": path}
    session = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "bench.pytest_report_now",
         "-q", str(tmp_path / "test_example.py")],
        cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        stacks = out / "stacks.log"
        for _ in range(600):  # the dump comes STACKS_AFTER_S after the start: test_hangs sleeps
            if stacks.is_file() and "test_hangs" in stacks.read_text():
                break
            time.sleep(0.1)
        assert session.poll() is None  # still running: nothing here waited for its end
        assert "test_hangs" in stacks.read_text()
        failures = (out / "failures.log").read_text()
        assert "test_fails (call)" in failures and "the reason it failed" in failures
        assert "test_hangs" not in failures
    finally:
        session.kill()
        session.wait()
