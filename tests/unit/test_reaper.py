"""The watcher beside a command's private Ray (``trainforge.driver.reaper``): once the command
is gone, however it ended, the processes of its Ray session end; a process that only reads a
file there, and any other process, are left alone. Real processes and a real SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from trainforge.driver import reaper

# A Ray daemon as the watcher sees one: it names its session folder on its command line and
# keeps a log there open.
DAEMON = """
import sys, time
log = open(sys.argv[1] + "/logs/daemon.log", "w")
print("ready", flush=True)
time.sleep(600)
"""
# A user's `tail -f` of that log: the file open, the folder not on its command line
READER = """
import os, time
log = open(os.environ["LOG"])
print("ready", flush=True)
time.sleep(600)
"""
COMMAND = """
import sys
from trainforge.driver import reaper
reaper.watch(sys.argv[1])
print("watching", flush=True)
sys.stdin.readline()
"""


def start(script: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", script, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env={**os.environ, **(env or {})},
    )  # fmt: skip
    assert process.stdout is not None
    assert process.stdout.readline() in ("ready\n", "watching\n")
    return process


def session(tmp_path: Path) -> Path:
    folder = tmp_path / "session_2026-01-01_00-00-00_000000_1"
    (folder / "logs").mkdir(parents=True)
    return folder


def test_the_session_processes_are_ray_s_with_a_file_there_open(tmp_path: Path) -> None:
    folder = session(tmp_path)
    daemon = start(DAEMON, str(folder))
    reader = start(READER, env={"LOG": str(folder / "logs" / "daemon.log")})
    elsewhere = start(DAEMON, str(session(tmp_path / "other")))
    try:
        assert [p.pid for p in reaper.session_processes(str(folder))] == [daemon.pid]
    finally:
        for process in (daemon, reader, elsewhere):
            process.kill()
            process.wait()


def test_a_killed_command_s_session_processes_end_and_nothing_else(tmp_path: Path) -> None:
    folder = session(tmp_path)
    daemon = start(DAEMON, str(folder))
    reader = start(READER, env={"LOG": str(folder / "logs" / "daemon.log")})
    command = start(COMMAND, str(folder))
    watcher = psutil.Process(command.pid).children()[0]
    try:
        os.kill(command.pid, signal.SIGKILL)  # as `kill -9` would: nothing of it runs after
        command.wait(timeout=10)
        started = time.monotonic()
        assert daemon.wait(timeout=reaper.GRACE_S + 10) == -signal.SIGTERM
        assert time.monotonic() - started < reaper.GRACE_S  # it ended at SIGTERM, at once
        watcher.wait(timeout=10)  # and the watcher is gone too (psutil.TimeoutExpired if not)
        assert reader.poll() is None
    finally:
        for process in (daemon, reader, command):
            process.kill()
            process.wait()


def test_after_a_normal_end_the_watcher_finds_nothing_and_ends(tmp_path: Path) -> None:
    folder = session(tmp_path)
    command = start(COMMAND, str(folder))
    watcher = psutil.Process(command.pid).children()[0]
    deadline = time.monotonic() + 30
    while not watcher.cmdline() and time.monotonic() < deadline:
        time.sleep(0.05)  # between fork and exec its command line reads empty (a loaded machine)
    assert watcher.cmdline()[-2:] == ["trainforge.driver.reaper", str(folder)]
    command.communicate("done\n", timeout=30)
    assert command.returncode == 0
    watcher.wait(timeout=10)  # not this test's child: psutil waits, with no exit status
