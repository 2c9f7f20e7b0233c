"""One command per run name (``trainforge.driver.run_lock``): a second command refuses while a
live one holds the lock, a dead holder's lock is taken over, another host's is respected."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from trainforge import cli
from trainforge.driver import launch, run_lock
from trainforge.errors import RecipeError

DIGITS = Path(__file__).resolve().parents[2] / "recipes" / "cnn" / "digits_simple_cnn.yaml"

HOLDER = """
import sys
from pathlib import Path
from trainforge.driver import run_lock
with run_lock.held(Path(sys.argv[1]), "busy"):
    print("holding", flush=True)
    sys.stdin.readline()
"""


def test_a_second_command_with_the_same_run_name_refuses_before_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ray may be up in this test process already (another test's); the command must not
    # even ask for it
    def no_ray(*args: object, **kwargs: object) -> None:
        raise AssertionError("the refused command connected to Ray")

    monkeypatch.setattr(launch, "connect", no_ray)
    lock = run_lock.lock_path(str(tmp_path), "busy")
    assert lock == tmp_path / ".busy.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        code = cli.main(["train", str(DIGITS), "run.name=busy", f"run.storage_path={tmp_path}",
                         "tracking.enabled=false"])  # fmt: skip
        assert code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1, err
        assert f"in use by another trainforge command (pid {holder.pid} on " in err[0]
        assert not (tmp_path / "busy").exists()  # refused before anything was started
    finally:
        holder.communicate("done\n", timeout=30)
    assert not lock.exists()  # the holder released it when it ended


def test_a_dead_holders_lock_is_taken_over(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    lock = tmp_path / ".r.lock"
    lock.write_text(json.dumps({"pid": int(gone.stdout), "host": socket.gethostname()}))
    with run_lock.held(lock, "r"):
        assert json.loads(lock.read_text())["pid"] == os.getpid()
        with pytest.raises(RecipeError, match=f"pid {os.getpid()}"):  # and it is held now
            run_lock.acquire(lock, "r")
    assert not lock.exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # nothing stale left beside it


def test_a_killed_holder_nobody_reaped_is_dead_too(tmp_path: Path) -> None:
    """`kill -9` of a command whose parent does not reap it (an orphan under a container's
    init): a zombie, which kill(pid, 0) still finds."""
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        os.kill(holder.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while psutil.Process(holder.pid).status() != psutil.STATUS_ZOMBIE:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        lock = tmp_path / ".r.lock"
        lock.write_text(json.dumps({"pid": holder.pid, "host": socket.gethostname()}))
        with run_lock.held(lock, "r"):
            assert json.loads(lock.read_text())["pid"] == os.getpid()
    finally:
        holder.wait()  # reaped only now


def test_a_live_or_unknowable_holder_keeps_it(tmp_path: Path) -> None:
    lock = tmp_path / ".r.lock"
    for holder in ({"pid": os.getppid(), "host": socket.gethostname()},  # alive here
                   {"pid": 1, "host": "another-host"}):  # fmt: skip
        lock.write_text(json.dumps(holder))
        with pytest.raises(RecipeError, match=f"pid {holder['pid']} on {holder['host']}"):
            run_lock.acquire(lock, "r")
        assert json.loads(lock.read_text()) == holder


def test_the_lock_goes_when_the_command_fails_and_stays_if_another_took_it(
    tmp_path: Path,
) -> None:
    lock = tmp_path / ".r.lock"
    with pytest.raises(ValueError), run_lock.held(lock, "r"):
        raise ValueError("the run failed")
    assert not lock.exists()
    token = run_lock.acquire(lock, "r")
    lock.write_text(json.dumps({"pid": 1, "host": "another-host"}))  # removed by hand, retaken
    run_lock.release(lock, token)
    assert lock.exists()
    assert run_lock.lock_path("s3://bucket/runs", "r") is None  # remote storage: no lock
    with run_lock.held(None, "r"):
        time.sleep(0)
