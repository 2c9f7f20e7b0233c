"""A request that a run end at its next epoch's end, finished: a file in the run's folder
whose text says who asked and why.

A sweep's scheduler (ASHA) stopping a trial writes it. Rank 0 reads it at every epoch end and
the ranks agree on it in that epoch's all-reduce (no collective of its own): the run validates,
saves its checkpoint, evaluates and ends FINISHED like an early-stopped run, and the command's
workers stay for the next run. A SIGTERM instead ends the run interrupted (resumable) and a
warm group's workers with it, as they may be inside a collective.
"""

from __future__ import annotations

from pathlib import Path

from trainforge import storage
from trainforge.atomic import replacing

FILE = "stop-request"


def write(run_dir: Path, reason: str) -> None:
    with replacing(run_dir / FILE) as temporary:
        temporary.write_text(reason + "\n")


def read(run_dir: str) -> str | None:
    """Why the run is asked to stop, or None (no request; remote storage holds none)."""
    folder = storage.local_folder(run_dir)
    if folder is None:
        return None
    try:
        return (folder / FILE).read_text().strip() or "a stop request"
    except OSError:
        return None
