"""Where a run's files live: a local (or NFS) folder, or a URI such as s3:// or gs:// that only
Ray Train's storage layer reaches (no folder to look into, nothing to scan or write beside)."""

from __future__ import annotations

from pathlib import Path


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
