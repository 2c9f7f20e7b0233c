"""Files written so that a reader never sees half of one: write a temporary file beside the
target, flush it to disk, then rename it over the target (atomic on POSIX file systems, NFS
included) and flush the folder, so that after a crash or power loss the target is either the
old file or the whole new one."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """Yields a temporary path to write; on success it replaces ``path``, on error it goes."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        yield temporary
        _fsync(temporary)  # the data is on disk before the name points at it
        os.replace(temporary, path)
        _fsync(path.parent)  # and the rename itself survives a crash
    finally:
        temporary.unlink(missing_ok=True)


def _fsync(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
