"""The lasting local cluster started in the background after a command that trained on processes
of its own (``driver/workers/own.py``), for later commands: a detached process
(``python -m trainforge.driver.background``) starts the cluster, the warm workers a command of the
same recipe would take, and their first run, a rehearsal (``rehearsal.py``), so the next command
finds them as warm as workers that have run once. It holds ``background.lock`` until it is done;
`trainforge cluster stop` ends it first (SIGTERM).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from trainforge import log
from trainforge.config import Recipe
from trainforge.driver import cluster_footprint, local_cluster, warm_pool

STOP_WAIT_S = 5.0  # a background start asked to stop (SIGTERM) gets this long before SIGKILL
GRACE_S = 4.0
"""How long a background start waits before its first step, for a command started right after
the one that made it (a script's next line): that command reaches its own processes
(``training_here``) 1-3 s after its start on this project's busy 2-core CPU, and then the
background start waits for it."""


def start_cluster(cfg: Recipe) -> None:
    """Start the lasting local cluster and the run's warm workers (``warm_pool.prestart``) for
    later commands, in a detached process (``main``), and say so; this command does not wait.
    The process holds ``background.lock`` until it is done (``wait``). Where
    another command's background start still runs, this one starts nothing: its cluster serves
    both, and this command does not wait for it to end. Where a cluster came up while this
    command ran, the process only readies this recipe's warm workers there."""
    local_cluster.folder().mkdir(parents=True, exist_ok=True)
    with (
        open(local_cluster.background_lock_path(), "a") as lock,
        open(local_cluster.background_log_path(), "ab") as out,
    ):
        try:  # taken here, so no one finds it free before the start
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.say("ray: the local cluster is being started in the background by another "
                    "command; later commands use it")  # fmt: skip
            return
        started_meanwhile = local_cluster.running()
        found = local_cluster.read_state() if started_meanwhile is None else None
        replacing = local_cluster.replacing_line(found) if found is not None else None
        lock.truncate(0)  # the last start's pid
        process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(lock.fileno())],
            stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, pass_fds=(lock.fileno(),),
        )  # fmt: skip
        lock.write(f"{process.pid}\n")  # whom `trainforge cluster stop` asks to end
        lock.flush()
        assert process.stdin is not None
        with process.stdin:
            process.stdin.write(pickle.dumps((cfg, sys.path)))
    if replacing:  # said here, not only in the background start's log
        log.say(replacing)
    log.say(start_line(cfg.scaling.num_workers, started_meanwhile))
    cost = cluster_footprint.cost_line(cfg.scaling.num_workers)
    if cost is not None:
        log.say(cost)


def start_line(num_workers: int, running: local_cluster.ClusterState | None) -> str:
    """What a command says of the background start it made: ``running`` is the lasting cluster
    where one came up while the command ran (``trainforge cluster start``, another command's
    background start), which only gets this recipe's warm workers."""
    workers = log.counted(num_workers, "warm worker", "warm workers")
    if running is not None:
        return (f"ray: the local cluster at {running.gcs_address} came up while this command "
                f"ran; readying {workers} there in the background for later commands")  # fmt: skip
    return f"ray: starting the local cluster and {workers} in the background for later commands"


def training_lock_path() -> Path:
    return local_cluster.folder() / "own-workers.lock"


@contextlib.contextmanager
def training_here() -> Iterator[None]:
    """Held (shared) by a command whose workers are processes of its own, for as long as they
    run: a background start does nothing while any command holds it (``yield_cores``)."""
    path = training_lock_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_SH)
        yield  # the lock dies with the process, a killed one's too


def commands_training() -> bool:
    """Whether a command trains on processes of its own now (holds ``training_here``)."""
    try:
        with open(training_lock_path(), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # no folder: no command ever trained here
        return False
    return False


def yield_cores(asked: Callable[[], bool], grace_s: float = 0.0) -> None:
    """Wait ``grace_s``, then while a command trains on processes of its own: the next step
    (Ray's start, the warm workers' imports, their rehearsal) would take the cores from it, and
    a command started right after a cold one ran slowest of all (digits on this project's
    2-core CPU: overhead 6.8 s against 5.2 s cold). Returns at once when ``asked`` to stop."""
    deadline, said = time.monotonic() + grace_s, False
    while not asked():
        training = commands_training()
        if not training and time.monotonic() >= deadline:
            return
        if training and not said:
            log.say("a command trains on processes of its own: waiting for it to end")
            said = True
        time.sleep(0.2)


def wait(timeout_s: float) -> bool:
    """Wait until no background start (``start_cluster``) runs; False on timeout."""
    deadline = time.monotonic() + timeout_s
    while local_cluster.background_start_running():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def stop(timeout_s: float = local_cluster.START_TIMEOUT_S + 30) -> None:
    """End a background start under way (``trainforge cluster stop`` does, before it stops the
    cluster, and ``cluster start --num-cpus``, before it starts its own): its process is asked
    with SIGTERM and waited for; a cluster start it began is let finish first (``StopAsked``),
    so that the cluster stopped after this is never one that comes up later."""
    if not local_cluster.background_start_running():
        return  # the lock's pid is an ended process's: never signalled
    deadline = time.monotonic() + 2  # its pid is written just after the process starts
    while (pid := _background_pid()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    if not wait(timeout_s) and pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait(STOP_WAIT_S)


def _background_pid() -> int | None:
    try:
        return int(local_cluster.background_lock_path().read_text())
    except (OSError, ValueError):
        return None


class StopAsked(KeyboardInterrupt):
    """SIGTERM to a background start (``stop``): raised in its main thread as a
    Ctrl-C is, so that what it started on the cluster stops the way a command's run does."""


class _StopOnTerm:
    """SIGTERM raises ``StopAsked``, except while the cluster starts: then it is raised once
    the start is over (``start_done``), so that the cluster is up for its stop and not left to
    come up after it (its supervisor is a process apart, which goes on starting Ray)."""

    def __init__(self) -> None:
        self.asked, self.starting = False, True
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum: int, frame: object) -> None:
        self.asked = True
        if not self.starting:
            raise StopAsked()

    def start_done(self) -> None:
        self.starting = False
        if self.asked:
            raise StopAsked()


def main(lock_fd: int) -> int:
    """The background start: the lasting cluster (``cluster.connect`` starts it, or joins one
    started meanwhile), then the warm workers a command of this recipe would take, and their
    first run, a rehearsal of this recipe (``rehearsal.py``), so the next command finds them
    as warm as workers that have run once. `trainforge cluster stop` ends it (SIGTERM)."""
    term = _StopOnTerm()
    cfg, sys_path = pickle.load(sys.stdin.buffer)
    sys.path[:] = sys_path  # the command's: the warm workers take it on
    workers = log.counted(cfg.scaling.num_workers, "warm worker", "warm workers")
    log.say(f"background start (pid {os.getpid()}): the local cluster and {workers} for later "
            "commands")  # fmt: skip
    try:
        from trainforge.driver import rehearsal
        from trainforge.driver.cluster import connect

        yield_cores(lambda: term.asked, GRACE_S)
        if not term.asked:  # a stop asked before the start starts nothing
            connect()
        term.start_done()
        yield_cores(lambda: term.asked)
        started = warm_pool.prestart(cfg)
        yield_cores(lambda: term.asked)
        code = rehearsal.rehearse(cfg, started)  # a stop there ends the rehearsal's run
        if code is not None and not term.asked:
            log.say(f"rehearsal {'done' if code == 0 else f'failed (exit {code})'}")
    except KeyboardInterrupt:  # StopAsked, or Ray's own for it where it waited in ray.get
        if not term.asked:
            raise
    if term.asked:
        log.say("background start ended by `trainforge cluster stop` (or `start --num-cpus`)")
    os.close(lock_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
