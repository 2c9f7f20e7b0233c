"""A command's private Ray ends with the command, even when the command is SIGKILLed.

A command that uses no lasting local cluster starts a private Ray (``cluster.connect``). Ray
makes its head processes share the driver's fate (the GCS, the raylet and the dashboard get
SIGKILL when the driver dies), and the workers end within seconds once their raylet is gone.
Two processes outlive it: the raylet's dashboard and runtime-env agents see their raylet die
"unexpectedly" and try for 60 s to tell the GCS, which died with the driver, before they exit
(Ray 2.60, ``ray._private.process_watcher``). A command ended by `kill -9` or the OOM killer
and run again would find them still there.

So beside its private Ray a command starts a watcher: a small process in a session of its own
(a Ctrl-C in the terminal does not reach it) reading a pipe that only the command writes to.
When the command ends, however it ends, the pipe reads end-of-file, and the watcher ends every
process that still has a file of that Ray's session folder open (each Ray process writes its
logs there): SIGTERM, then SIGKILL after a grace period. After a normal end ``ray.shutdown``
has ended them already and the watcher finds none.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
from pathlib import Path

import psutil

GRACE_S = 3.0
"""How long the watcher waits after SIGTERM before SIGKILL."""

_watchers: list[subprocess.Popen[bytes]] = []  # their pipes stay open while this process lives


def watch(session_dir: str) -> None:
    """Start the watcher for the private Ray whose session folder is ``session_dir``."""
    _watchers.append(
        subprocess.Popen(
            [sys.executable, "-m", "trainforge.driver.reaper", session_dir],
            stdin=subprocess.PIPE,  # this end is not inherited by Ray's processes (O_CLOEXEC)
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    )


def session_processes(session_dir: str) -> list[psutil.Process]:
    """The processes, other than this one, that have a file under ``session_dir`` open and are
    Ray's: named ``ray…`` (``raylet``, ``ray::…`` workers and agents, ``ray-dashboard-…``) or
    ``gcs_server``, or naming the folder on their command line (Ray's Python daemons). A
    user's ``tail -f`` of a log there is left alone."""
    folder = str(Path(session_dir))
    own = psutil.Process().pid
    found = []
    for process in psutil.process_iter():
        try:
            if process.pid == own or not _has_open_under(process, folder):
                continue
            if process.name().startswith(("ray", "gcs_server")) or any(
                arg == folder or arg.endswith("=" + folder) or folder + "/" in arg
                for arg in process.cmdline()
            ):
                found.append(process)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue  # gone meanwhile, or another user's: not this command's
    return found


def _has_open_under(process: psutil.Process, folder: str) -> bool:
    return any(f.path.startswith(folder + "/") for f in process.open_files())


def end(processes: list[psutil.Process], grace_s: float = GRACE_S) -> None:
    """SIGTERM, then SIGKILL for those still there after ``grace_s``."""
    for process in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.terminate()
    _, alive = psutil.wait_procs(processes, timeout=grace_s)
    for process in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            process.kill()


def main(session_dir: str) -> int:
    """The watcher: wait until the command is gone, then end what is left of its Ray."""
    sys.stdin.buffer.read()  # the command never writes: this returns when it has ended
    end(session_processes(session_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
