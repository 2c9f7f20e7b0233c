"""One command per run name at a time: ``trainforge train`` holds a lock file for the whole
command, so a second command with the same ``run.name`` refuses in one line before it connects
to Ray, instead of two drivers training into one run folder and one MLflow run.

The lock is ``.<run.name>.lock`` beside the run folder (``storage_path``), not inside it: a run
that is refused or fails before training leaves no run folder behind, and ``checkpoint.resume``
keeps meaning "this run has started before". It holds the holder's pid and host. It is created
with O_EXCL (atomic on local file systems and NFSv3+), removed when the command ends however it
ends, and taken over when its holder is gone: a pid that no longer exists on this host, or one
that exited and was never reaped. A holder on another host cannot be checked from here; the
message says which file to remove. Remote storage (``s3://…``) has no folder to hold a lock in:
not locked.
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

import psutil

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
    RecipeError when a live command holds it."""
    if path is None:
        yield
        return
    token = acquire(path, run_name)
    try:
        yield
    finally:
        release(path, token)


def one_at_a_time(train: Callable[[Recipe], T]) -> Callable[[Recipe], T]:
    """Decorates ``launch.train``: the whole command runs holding the run's lock."""

    @functools.wraps(train)
    def locked(cfg: Recipe) -> T:
        storage_path = storage.absolute(cfg.run.storage_path)
        storage.check_writable(storage_path, cfg.run.name)  # the lock is the first file there
        with held(lock_path(storage_path, cfg.run.name), cfg.run.name):
            return train(cfg)

    return locked


def acquire(path: Path, run_name: str) -> str:
    """Create the lock (taking over a dead holder's once); returns what it holds."""
    token = json.dumps({"pid": os.getpid(), "host": socket.gethostname()})
    path.parent.mkdir(parents=True, exist_ok=True)
    for _ in range(2):  # the second try follows the removal of a dead holder's lock
        try:
            descriptor = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read(path)
            if not _dead(holder):
                raise _busy(path, run_name, holder) from None
            _remove_stale(path, holder)
            continue
        with os.fdopen(descriptor, "w") as stream:
            stream.write(token + "\n")
        return token
    raise _busy(path, run_name, _read(path))


def release(path: Path, token: str) -> None:
    """Remove the lock if it is still this command's."""
    if _read(path) == json.loads(token):
        path.unlink(missing_ok=True)


def _read(path: Path) -> dict[str, Any]:
    """The holder's pid and host; {} when the file is gone or half-written."""
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _dead(holder: dict[str, Any]) -> bool:
    """True only when the holder is known gone: its pid no longer exists on this host."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    return _exited(holder["pid"])


def _exited(pid: int) -> bool:
    """A zombie: exited (`kill -9`, the OOM killer) but not reaped, so kill(pid, 0) still
    succeeds. A killed command whose parent is gone stays so under an init that does not reap
    orphans (a container's), and would keep its lock for ever."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:  # gone meanwhile
        return True
    except psutil.Error:  # not ours to look at: alive
        return False


def _remove_stale(path: Path, holder: dict[str, Any]) -> None:
    """Move the dead holder's lock aside and delete it. The rename is atomic: of two commands
    taking over at once only one moves it; if what was moved is not the dead holder's (a live
    command took over in between), it is put back."""
    aside = path.with_name(f"{path.name}.stale.{os.getpid()}")
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    if _read(aside) == holder:
        aside.unlink(missing_ok=True)
    else:
        os.rename(aside, path)


def _busy(path: Path, run_name: str, holder: dict[str, Any]) -> RecipeError:
    who = f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}"
    return RecipeError(
        f"run.name: run {run_name!r} is in use by another trainforge command ({who}); wait for "
        f"it, pick another run.name, or remove {path} if that command is gone"
    )
