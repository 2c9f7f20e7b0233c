"""One command per run name (``trainforge.driver.run_lock``): a second command refuses while a
live one holds the lock (filelock), a killed holder's is taken over, reaped or not."""

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


def _holder(lock: Path) -> subprocess.Popen[str]:
    """A live command holding ``lock`` until told to end (or killed)."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(lock)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
    return holder


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
    holder = _holder(lock)
    try:
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


def test_a_killed_holders_lock_is_taken_over_reaped_or_not(tmp_path: Path) -> None:
    """`kill -9` of a holding command: once reaped, and before (a zombie, which an init that does
    not reap orphans keeps, and which kill(pid, 0) still finds)."""
    lock = tmp_path / ".r.lock"
    for reaped in (True, False):
        holder = _holder(lock)
        try:
            busy = pytest.raises(RecipeError, match=f"pid {holder.pid} on ")
            with busy, run_lock.held(lock, "r"):
                pass
            os.kill(holder.pid, signal.SIGKILL)
            if reaped:
                holder.wait()
            else:
                deadline = time.monotonic() + 10
                while psutil.Process(holder.pid).status() != psutil.STATUS_ZOMBIE:
                    assert time.monotonic() < deadline
                    time.sleep(0.05)
            assert json.loads(lock.read_text())["pid"] == holder.pid  # its file, left behind
            with run_lock.held(lock, "r"):
                assert json.loads(lock.read_text())["pid"] == os.getpid()
        finally:
            holder.kill()
            holder.wait()
        assert not lock.exists()
    assert [p.name for p in tmp_path.iterdir()] == []  # nothing stale left beside it


def test_a_left_file_naming_a_live_pid_does_not_block(tmp_path: Path) -> None:
    """What holds the run is the lock, not the file: a file left by a killed command whose pid is
    now another live process's (pids are reused), or by a command on a host that has gone."""
    lock = tmp_path / ".r.lock"
    for left in ({"pid": os.getppid(), "host": socket.gethostname()},
                 {"pid": 1, "host": "another-host"}):  # fmt: skip
        lock.write_text(json.dumps(left))
        with run_lock.held(lock, "r"):
            assert json.loads(lock.read_text()) == {"pid": os.getpid(),
                                                    "host": socket.gethostname()}  # fmt: skip
        assert not lock.exists()


def test_a_lock_held_in_this_process_refuses_a_second_hold(tmp_path: Path) -> None:
    lock = tmp_path / ".r.lock"
    with run_lock.held(lock, "r"):
        with pytest.raises(RecipeError, match=f"pid {os.getpid()}"), run_lock.held(lock, "r"):
            pass
        assert json.loads(lock.read_text())["pid"] == os.getpid()  # still held, still named


def test_the_lock_goes_when_the_command_fails(tmp_path: Path) -> None:
    lock = tmp_path / ".r.lock"
    with pytest.raises(ValueError), run_lock.held(lock, "r"):
        raise ValueError("the run failed")
    assert not lock.exists()
    holder = _holder(lock)  # another command takes it at once
    holder.communicate("done\n", timeout=30)
    assert holder.returncode == 0 and not lock.exists()
    assert run_lock.lock_path("s3://bucket/runs", "r") is None  # remote storage: no lock
    with run_lock.held(None, "r"):
        time.sleep(0)


def _train(folder: Path, *overrides: str) -> subprocess.CompletedProcess[str]:
    """A real ``trainforge train`` of the digits recipe, run in ``folder``."""
    command = [sys.executable, "-m", "trainforge", "train", str(DIGITS), *overrides]
    return subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=300)


def test_a_refused_command_leaves_nothing_it_made(tmp_path: Path) -> None:
    """Refused after the lock was taken (the data are checked under it): no storage folder, nor
    the parents of one it made, in the folder the command ran in."""
    missing_data = ("workload.dataset=imagefolder", f"workload.data_root={tmp_path}-no-data")
    for storage in ((), ("run.storage_path=deeper/still/runs",)):
        done = _train(tmp_path, *missing_data, *storage)
        assert done.returncode == 2, done.stderr
        err = done.stderr.strip().splitlines()
        assert len(err) == 1 and "workload.data_root" in err[0], err
        assert done.stdout == ""
        assert list(tmp_path.iterdir()) == [], storage


def test_a_command_refused_by_the_lock_leaves_the_holders_folders(tmp_path: Path) -> None:
    """The runs folder, the run folder (just made, empty yet) and the lock of the command that
    holds the run stay when a second command with the same run.name is refused."""
    runs = tmp_path / "runs"
    holder = _holder(run_lock.lock_path(str(runs), "busy") or runs)
    (runs / "busy").mkdir()
    try:
        done = _train(tmp_path, "run.name=busy")
        assert done.returncode == 2
        assert "in use by another trainforge command" in done.stderr
        assert sorted(p.name for p in runs.iterdir()) == [".busy.lock", "busy"]
    finally:
        holder.communicate("done\n", timeout=30)
