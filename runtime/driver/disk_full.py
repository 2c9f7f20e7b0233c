"""A disk that filled up under a worker, told in one line: which file, and where the run stands.

A worker that writes a checkpoint (the state file in its temporary folder, or Ray Train's copy
of it into ``run.storage_path``) on a full file system gets ``OSError`` ENOSPC, and the run
ends like any worker failure. Instead of the worker's traceback the command names the path and
the run's latest valid checkpoint, and exits 1. Nothing half-written is taken as the latest:
checkpoint files are written under temporary names (``atomic.replacing``, removed on error),
a checkpoint's manifest last, and a copy cut short fails verification on resume.
``TRAINFORGE_ENOSPC_AT_CHECKPOINT=N`` makes rank 0's N-th checkpoint meet a full disk part-way
through its state file (``worker/faults.py``): how the tests produce one without filling a disk.
"""

from __future__ import annotations

import errno
import json

from trainforge import ray_compat, storage

NO_SPACE = "No space left on device"
"""The OS's words, also in the messages of errors that carry no errno (pyarrow's copies)."""


def explain(exc: BaseException, run_dir: str) -> str | None:
    """One line when a worker ran out of disk space behind a failed ``fit()``, else None."""
    full = {
        rank: error
        for rank, error in ray_compat.worker_failures(exc).items()
        if isinstance(error, OSError) and (error.errno == errno.ENOSPC or NO_SPACE in str(error))
    }
    if not full:
        return None
    rank, error = next(iter(full.items()))
    where = f"writing {error.filename}" if error.filename else f"in {run_dir}"
    return (
        f"the disk is full: {NO_SPACE} {where} (rank {rank}); {_latest(run_dir)}; free space "
        "there, then re-run the same command to resume"
    )


def _latest(run_dir: str) -> str:
    """Where a resume starts: the run's latest valid checkpoint, by its manifest."""
    from trainforge import checkpoint

    folder = storage.local_folder(run_dir)
    if folder is None:  # remote storage: nothing to look into from here
        return "the checkpoints saved before it are kept"
    newest = checkpoint.newest_verified(folder) if folder.is_dir() else None
    if newest is None:
        return "no checkpoint was saved before it"
    manifest = json.loads((newest / checkpoint.MANIFEST_FILE).read_text())
    return f"the latest valid checkpoint is {newest.name} (step {manifest['global_step']})"
