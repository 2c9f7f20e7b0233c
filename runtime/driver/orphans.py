"""The processes a lasting local cluster's Ray started, found without its supervisor.

A supervisor that is SIGKILLed (or dies) leaves Ray's GCS, raylet, dashboard, agents and the
warm workers running, ~2.7 GB of memory that nothing else knows of. They are found by their
environment: the supervisor gives `ray start` ``RAY_ADDRESS=<the cluster's GCS>``, and every
process Ray starts inherits it (warm workers retitle themselves, so their command lines do
not tell). Only this user's processes are looked at.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

GRACE_S = 5.0  # SIGTERM's wait before SIGKILL


def of_cluster(gcs_address: str) -> list[int]:
    """Living processes of this user that the cluster at ``gcs_address`` started."""
    marker = f"RAY_ADDRESS={gcs_address}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if entry.stat().st_uid != os.getuid() or zombie(int(entry.name)):
                continue
            if marker in (entry / "environ").read_bytes().split(b"\0"):
                found.append(int(entry.name))
        except OSError:  # ended meanwhile
            continue
    return found


def end(pids: list[int], grace_s: float = GRACE_S) -> None:
    """SIGTERM each, then SIGKILL those still there after ``grace_s``."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while (left := [pid for pid in pids if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _running(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and not zombie(pid)


def zombie(pid: int) -> bool:
    """Exited but not reaped (its parent gone, and an init that does not reap orphans leaves
    it so): kill(pid, 0) still succeeds, /proc still lists it."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] == "Z"
