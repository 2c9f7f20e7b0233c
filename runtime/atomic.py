"""Files written so that a reader never sees half of one: write a temporary file beside the
target, then rename it over the target (atomic on POSIX file systems, NFS included)."""

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
        os.replace(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
