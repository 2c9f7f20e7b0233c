"""Where a run's files live: a local (or NFS) folder, or a URI such as s3:// or gs:// that only
Ray Train's storage layer reaches (no folder to look into, nothing to scan or write beside).

A local folder is tried before anything starts (``check_writable``): a probe file is written,
flushed and removed, so that a path through a file, a read-only mount, a folder of another user
or a full disk is one line and exit 2 — not a traceback from the run lock, from Ray Train's own
storage check, or from the first checkpoint after minutes of training."""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
from collections.abc import Iterator
from pathlib import Path

from trainforge.errors import RecipeError

PROBE_BYTES = 4096
"""What the probe writes: one block, so that a disk with inodes but no free blocks fails too."""


def is_uri(location: str) -> bool:
    """True for remote storage named by a URI (``s3://bucket/runs``), False for a path."""
    return "://" in location


def local_folder(location: str | None) -> Path | None:
    """The folder to read and write beside Ray Train's files, or None for remote storage."""
    if location is None or is_uri(location):
        return None
    return Path(location)


def absolute(location: str) -> str:
    """A path made absolute (Ray workers run in other directories); URIs pass through."""
    if is_uri(location):
        return location
    return str(Path(location).expanduser().resolve())


def check_writable(location: str, run_name: str) -> None:
    """Refuse (RecipeError, naming the folder and the problem) a local ``run.storage_path`` that
    cannot be written: the folder is made if missing (as the run would make it) and a probe file
    written in it, and in the run's folder when that exists (a resume), then removed. The run
    folder itself is never made here: a refused run leaves none behind. URIs are Ray Train's
    to reach: not checked."""
    folder = local_folder(location)
    if folder is None:
        return
    run_folder = folder / run_name
    for target in (folder, run_folder) if run_folder.is_dir() else (folder,):
        try:
            target.mkdir(parents=True, exist_ok=True)
            _probe(target)
        except OSError as exc:
            reason = _reason(exc)
            raise RecipeError(f"run.storage_path: cannot write in {target}: {reason}") from None


@contextlib.contextmanager
def removed_if_left_empty(folder: Path | None) -> Iterator[None]:
    """Run the block; then remove ``folder`` and those of its parents that did not exist
    before it, where the block left them empty: a command that is refused, or stops before it
    writes anything, leaves behind no folder it made. Only empty ones (``rmdir``): whatever
    another command keeps in one (its run's lock, its run) keeps it. None: nothing."""
    chain = () if folder is None else (folder, *folder.parents)
    missing = list(itertools.takewhile(lambda path: not os.path.lexists(path), chain))
    try:
        yield
    finally:
        for made in missing:  # the deepest first
            try:
                made.rmdir()
            except FileNotFoundError:
                continue
            except OSError:  # not empty, or no longer ours to remove: nor are its parents
                break


def _probe(folder: Path) -> None:
    """Create, fill, flush and remove a file of this process's own in ``folder``."""
    probe = folder / f".trainforge-probe-{os.getpid()}-{os.urandom(4).hex()}"
    descriptor = os.open(probe, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        os.write(descriptor, b"\0" * PROBE_BYTES)
        os.fsync(descriptor)  # a full disk can accept the write and refuse the flush
    finally:
        os.close(descriptor)
        probe.unlink(missing_ok=True)


def _reason(exc: OSError) -> str:
    """The OS's words for the problem, or which part of the path is a file when one is."""
    if exc.errno in (errno.ENOTDIR, errno.EEXIST) and exc.filename:
        blocker = _file_in_the_way(Path(exc.filename))
        if blocker is not None:
            return f"{blocker} is a file, not a folder"
    return exc.strerror or str(exc)


def _file_in_the_way(path: Path) -> Path | None:
    """The first part of ``path`` that exists and is not a folder, if any."""
    for part in reversed([path, *path.parents]):
        if part.exists() and not part.is_dir():
            return part
    return None
