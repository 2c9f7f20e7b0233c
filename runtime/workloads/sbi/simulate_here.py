"""The simulation stage without the cluster: simulations that one CPU core makes in seconds are
made by a process of the command's own, on its machine, started before Ray is reached, so that
its torch import and its work overlap Ray's start.

Why: on the cluster, the stage's first task starts a new Ray worker process that imports torch
(on a GPU host it also makes a CUDA context: a GPU task's process serves one task), and that
took 3.7 s of a warm command on this project's CPU and ~12 s of a cold one on an H200 host, for
milliseconds of simulating a built-in task.

The process writes what the Ray stage on the CPU would write — the same chunks with the same
seeds, each file written whole or not at all, the manifest last — so an interrupted stage
resumes either way. It runs in a session of its own: a Ctrl-C reaches the command, which ends
it (SIGTERM; its half-written file is removed on the way out).
"""

from __future__ import annotations

import atexit
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from trainforge.errors import RecipeError
from trainforge.workloads.sbi import simulate

POLL_S = 0.05
RECIPE_ERROR = "recipe error: "  # how the process tells a RecipeError (a user's simulator's)


@dataclass
class Started:
    process: subprocess.Popen[bytes]
    errors: IO[bytes]  # the process's stderr: its traceback, if it fails
    at: float  # time.time() when started (the manifest's mtime tells when it ended)
    rows_before: int  # simulations already on disk then: what the command resumed, not made


_started: dict[Path, Started] = {}


def started(job: simulate.Plan) -> bool:
    """Has this command started ``job`` (and not yet waited for it)?"""
    return job.folder in _started


def start(cfg: Any, seed: int, job: simulate.Plan) -> bool:
    """Start making ``job``'s missing chunks; False when already started by this command."""
    if job.folder in _started:
        return False
    errors = tempfile.TemporaryFile()  # noqa: SIM115 (it outlives this call: _end closes it)
    process = subprocess.Popen(
        [sys.executable, "-m", __name__],
        stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors,
        start_new_session=True,  # a Ctrl-C is the command's to handle
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert process.stdin is not None
    with process.stdin:
        process.stdin.write(pickle.dumps((cfg, seed, job)))
    _started[job.folder] = Started(process, errors, time.time(), _rows_on_disk(job))
    return True


def rows_before(job: simulate.Plan) -> int:
    """The simulations of ``job`` on disk when this command started its process: a process
    started while Ray started may have finished before the stage looks, and what it made is
    not a resumed entry's."""
    return _started[job.folder].rows_before


def _rows_on_disk(job: simulate.Plan) -> int:
    return sum(n for i, n in job.chunks if job.chunk_path(i).is_file())


def wait(job: simulate.Plan, progress: Callable[[int], None]) -> float:
    """Wait for ``job``'s process (started by ``start``); the seconds it took, from its start
    to its manifest (it may have ended long before this wait). Every ``PROGRESS_EVERY_S``
    calls ``progress`` with the simulations on disk. Raises with the process's last error
    line if it failed; ends it if the wait is interrupted."""
    started = _started[job.folder]
    last = time.monotonic()
    try:
        while started.process.poll() is None:
            time.sleep(POLL_S)
            if time.monotonic() - last >= simulate.PROGRESS_EVERY_S:
                last = time.monotonic()
                progress(_rows_on_disk(job))
        started.errors.seek(0)
        lines = started.errors.read().decode(errors="replace").strip().splitlines()
    finally:
        _end(job.folder)
    if started.process.returncode != 0:
        why = lines[-1] if lines else f"exit code {started.process.returncode}"
        if why.startswith(RECIPE_ERROR):
            raise RecipeError(why.removeprefix(RECIPE_ERROR))
        raise RuntimeError(f"simulations on this machine failed: {why}")
    return max(0.0, (job.folder / simulate.MANIFEST).stat().st_mtime - started.at)


def _end(folder: Path) -> None:
    started = _started.pop(folder, None)
    if started is None:
        return
    if started.process.poll() is None:
        started.process.terminate()
        started.process.wait()
    started.errors.close()


@atexit.register
def _end_all() -> None:
    """A command that fails before it waits (Ray did not start) leaves no process behind."""
    for folder in list(_started):
        _end(folder)


def main() -> None:
    """The process: the pickled (section, seed, plan) on stdin; the chunks and the manifest."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `finally` blocks remove temp files
    cfg, seed, job = pickle.load(sys.stdin.buffer)
    worker = f"{socket.gethostname()}:{os.getpid()}"
    done = {}  # the folder and its spec: written by the command before it started this process
    try:
        for index, size in job.missing():
            result = simulate.simulate_chunk(cfg, seed, index, size, "cpu") | {"worker": worker}
            simulate.save_chunk(result, job.chunk_path(index))
            done[index] = simulate.chunk_facts(result)
    except RecipeError as exc:  # one line for the command to raise again, no traceback
        sys.stderr.write(f"{RECIPE_ERROR}{' '.join(str(exc).split())}\n")
        sys.exit(2)
    simulate.finish(job, done)


if __name__ == "__main__":
    main()
