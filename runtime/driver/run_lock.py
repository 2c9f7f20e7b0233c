"""One command per run name, through filelock's flock(2) lock, which the kernel lets go of
however its holder ends; on NFS, Linux makes flock an NFS lock that every node honours (NFSv4,
or NFSv3 with lockd; a ``nolock`` mount keeps locks to each node).

``trainforge train`` holds the lock for the whole command, so a second command with the same
``run.name`` refuses in one line before it connects to Ray, instead of two drivers training into
one run folder and one MLflow run.

The lock is ``.<run.name>.lock`` beside the run folder (``storage_path``), not inside it: a run
that is refused or fails before training leaves no run folder behind, and ``checkpoint.resume``
keeps meaning "this run has started before"; nor the storage folder, where the command made it
(``run_held``). Who holds it is the flock, not the file: a command
killed with ``kill -9``, by the OOM killer, or never reaped (a zombie under a container's init)
has let go of it, whatever its pid became since, and its file is simply taken. The holder writes
its pid and host into the file for the refusal's message. On NFS a node that dies holding it lets
go when its NFSv4 lease runs out (90 s by default). The command removes the file before it lets
go. A file system without locks (an NFS mount with neither lockd nor NFSv4 locking, some FUSE
mounts) is one line naming the folder. Remote storage (``s3://…``) has no folder: not locked.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from filelock import FileLock, Timeout

from trainforge import storage
from trainforge.errors import RecipeError

if TYPE_CHECKING:
    from trainforge.config import Recipe

T = TypeVar("T")


def lock_path(storage_path: str, run_name: str) -> Path | None:
    """Where the run's lock lives, or None for remote storage."""
    folder = storage.local_folder(storage_path)
    return None if folder is None else folder / f".{run_name}.lock"


@contextlib.contextmanager
def held(path: Path | None, run_name: str) -> Iterator[None]:
    """Hold the lock at ``path`` (None: nothing to lock) while the block runs; raises
    RecipeError when another live command holds it."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(path, on_acquired=_write_holder)
    try:
        lock.acquire(blocking=False)
    except Timeout:
        raise _busy(run_name, _read(path)) from None
    except OSError as error:  # ENOLCK: the file system keeps no locks
        raise RecipeError(
            f"run.storage_path: {path.parent} cannot hold the run's lock ({error.strerror}); "
            "use storage that supports file locks (on NFS: NFSv4, or lockd for NFSv3)"
        ) from None
    try:
        yield
    finally:
        # Removed while still held: a command that opened this file just now finds it unlinked
        # when its flock succeeds, and filelock does not count that as holding it.
        path.unlink(missing_ok=True)
        lock.release()


@contextlib.contextmanager
def run_held(storage_path: str, run_name: str) -> Iterator[None]:
    """The block runs holding the lock of the run ``run_name`` under ``storage_path`` (absolute),
    the folder checked writable first. The storage folder (and its missing parents) and the run
    folder that the command made are removed again where it leaves them empty, refused or not:
    a refusal leaves nothing behind. The run folder only while the lock is held (another
    command's run may have made it, empty yet), the storage folder after: it is kept by any
    other run's lock or folder in it."""
    folder = storage.local_folder(storage_path)
    with storage.removed_if_left_empty(folder):
        storage.check_writable(storage_path, run_name)  # the lock is the first file there
        run_folder = None if folder is None else folder / run_name
        lock = lock_path(storage_path, run_name)
        with held(lock, run_name), storage.removed_if_left_empty(run_folder):
            yield


def one_at_a_time(train: Callable[[Recipe], T]) -> Callable[[Recipe], T]:
    """Decorates ``launch.train``: the whole command runs holding the run's lock."""

    @functools.wraps(train)
    def locked(cfg: Recipe) -> T:
        with run_held(storage.absolute(cfg.run.storage_path), cfg.run.name):
            return train(cfg)

    return locked


def _write_holder(descriptor: int) -> None:
    """filelock's ``on_acquired``: the file names its holder, for a refused command to say."""
    holder = json.dumps({"pid": os.getpid(), "host": socket.gethostname()}) + "\n"
    os.ftruncate(descriptor, 0)
    os.pwrite(descriptor, holder.encode(), 0)


def _read(path: Path) -> dict[str, Any]:
    """The holder's pid and host; {} when the file is gone or not yet written."""
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _busy(run_name: str, holder: dict[str, Any]) -> RecipeError:
    who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
    return RecipeError(
        f"run.name: run {run_name!r} is in use by another trainforge command ({who}); wait for "
        "it to end or pick another run.name"
    )
