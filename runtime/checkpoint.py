"""Checkpoint files, and where they go.

A checkpoint is one folder: ``state.pt`` (the train state — model, optimizer, scheduler, scaler,
position, early stopping, every rank's RNG state; see ``trainforge.worker.state``) plus the
resolved recipe. Everything in ``state.pt`` is plain tensors, numbers and containers, so it
loads with ``torch.load(weights_only=True)`` — no pickled code runs when a checkpoint is opened —
and ``load(path)["model"]`` is a plain state dict.

A ``Reporter`` takes the folder away: ``RayReporter`` hands it to ``ray.train.report``, which
persists it under ``storage_path/run.name`` as ``checkpoint_*`` and keeps the last N; re-running
the same run name makes Ray Train hand the latest one back. ``RunFolderReporter`` copies it into
the run folder the same way (the command's own workers and warm workers); ``FolderReporter``
into a local folder (a worker loop run without Ray, as the tests do).

Every checkpoint carries ``manifest.json`` — each file's name, size and sha256 — written last,
each file through ``atomic.replacing`` (fsynced, renamed into place: never written in place).
A copy cut short (Ray persists the folder file by file), truncated or bit-flipped later, or
without a manifest fails ``verify``; the search for the latest checkpoint skips it, says so in
one line, and takes the previous valid one. When checkpoints exist and none is valid the run is
refused (``NoValidCheckpoint``) and nothing is deleted.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from trainforge import log, ray_compat, storage
from trainforge.atomic import replacing
from trainforge.errors import NoValidCheckpoint

STATE_FILE = "state.pt"
RECIPE_FILE = "recipe.yaml"
MANIFEST_FILE = "manifest.json"
MANIFEST_FORMAT = 1


class Unverified(Exception):
    """A checkpoint folder whose files do not match its manifest (or that has none); the message
    names the folder and what is wrong, in a few words."""


@dataclass
class Position:
    """Where training stands: the next epoch to run and optimizer steps already done in it."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0


def save(folder: Path, state: dict[str, Any], recipe_yaml: str) -> None:
    """Write a checkpoint into ``folder`` (a fresh one): the files, then the manifest."""
    if (folder / MANIFEST_FILE).exists():
        raise FileExistsError(f"{folder} holds a checkpoint already: never written in place")
    import torch  # here, not at the top: the driver checks checkpoints without torch

    with replacing(folder / STATE_FILE) as temporary:
        torch.save(state, temporary)
    with replacing(folder / RECIPE_FILE) as temporary:
        temporary.write_text(recipe_yaml)
    files = {name: {"size": (folder / name).stat().st_size, "sha256": _sha256(folder / name)}
             for name in (STATE_FILE, RECIPE_FILE)}  # fmt: skip
    manifest = {"format": MANIFEST_FORMAT, "global_step": state.get("global_step"), "files": files}
    with replacing(folder / MANIFEST_FILE) as temporary:  # last: its presence seals the rest
        temporary.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def verify(folder: Path) -> dict[str, Any]:
    """The folder's manifest, once every file it lists has the listed size and sha256;
    raises ``Unverified`` naming what is wrong."""
    try:
        manifest = json.loads((folder / MANIFEST_FILE).read_text())
        files = manifest["files"]
        listed = {name: (int(entry["size"]), str(entry["sha256"])) for name, entry in files.items()}
    except FileNotFoundError:
        raise Unverified(f"{folder.name}: no {MANIFEST_FILE} (a copy cut short?)") from None
    except (ValueError, KeyError, TypeError, AttributeError):
        raise Unverified(f"{folder.name}: {MANIFEST_FILE} is unreadable") from None
    if STATE_FILE not in listed:
        raise Unverified(f"{folder.name}: {MANIFEST_FILE} does not list {STATE_FILE}")
    for name, (size, digest) in listed.items():
        path = folder / name
        if not path.is_file():
            raise Unverified(f"{folder.name}/{name}: missing")
        if path.stat().st_size != size:
            raise Unverified(
                f"{folder.name}/{name}: {path.stat().st_size} bytes where the manifest says "
                f"{size} (truncated?)"
            )
        if _sha256(path) != digest:
            raise Unverified(f"{folder.name}/{name}: sha256 differs from the manifest (corrupted)")
    return dict(manifest)


def load(folder: Path | str, verified: bool = True) -> dict[str, Any]:
    """A checkpoint's state, checked against its manifest first (``verified``; raises
    ``Unverified``). ``weights_only``: no pickled code runs."""
    import torch

    folder = Path(folder)
    if verified:
        verify(folder)
    return torch.load(folder / STATE_FILE, map_location="cpu", weights_only=True)


@dataclass
class Found:
    """The latest valid checkpoint's state (None: none), and why each one passed over was."""

    state: dict[str, Any] | None = None
    skipped: list[str] = field(default_factory=list)

    def warning(self) -> str | None:
        """One line about the checkpoints skipped, or None when none was."""
        if not self.skipped:
            return None
        step = "nothing" if self.state is None else f"step {self.state['global_step']}"
        return (
            f"skipped {log.counted(len(self.skipped), 'checkpoint', 'checkpoints')} that failed "
            "verification "
            f"({'; '.join(self.skipped)}); resuming from {step}"
        )


def newest_in(run_dir: Path) -> Found:
    """The valid checkpoint in ``run_dir`` with the most optimizer steps (by their manifests),
    and the reasons the folders ranked above it were skipped. Only the one taken is loaded."""
    found = Found()
    for folder in _most_steps_first(run_dir):
        try:
            found.state = load(folder)
            return found
        except Unverified as exc:
            found.skipped.append(str(exc))
        except Exception as exc:  # the manifest matched, yet torch cannot read it
            found.skipped.append(f"{folder.name}/{STATE_FILE}: unreadable ({type(exc).__name__})")
    return found


def newest_verified(run_dir: Path) -> Path | None:
    """The folder of the valid checkpoint with the most steps (its state is not loaded)."""
    return _verified_search(run_dir)[0]


def check_resumable(run_dir: Path) -> Path | None:
    """Before any worker starts: refuse a run whose checkpoints all fail verification (each
    file's size and sha256 against the manifest); else the folder of the newest valid one
    (None: no checkpoint yet). The driver does not load one: torch's import alone takes 1.5 s
    on this project's CPU, for a command that only checks the files. A verified file that
    torch cannot read is skipped by the worker's own ``newest_in``."""
    newest, skipped = _verified_search(run_dir)
    if newest is None and skipped:
        raise _none_valid(run_dir, skipped)
    return newest


def _verified_search(run_dir: Path) -> tuple[Path | None, list[str]]:
    """The folder of the valid checkpoint with the most steps (None: none), and why each one
    ranked above it failed verification."""
    skipped: list[str] = []
    for folder in _most_steps_first(run_dir):
        try:
            verify(folder)
            return folder, skipped
        except Unverified as exc:
            skipped.append(str(exc))
    return None, skipped


def _none_valid(where: Path | str, skipped: list[str]) -> NoValidCheckpoint:
    return NoValidCheckpoint(
        f"checkpoint: no valid checkpoint in {where} ({'; '.join(skipped)}); nothing was deleted: "
        "move the broken checkpoint folders aside to resume from an older one, or start afresh "
        "under a new run.name"
    )


def _most_steps_first(run_dir: Path) -> list[Path]:
    """The checkpoint folders by the manifest's step, then the name (Ray's are timestamps). A
    folder without a readable manifest ranks first, so that a skipped newest copy is named."""

    def steps(folder: Path) -> tuple[int, str]:
        try:
            step = int(json.loads((folder / MANIFEST_FILE).read_text())["global_step"])
        except Exception:
            step = sys.maxsize
        return step, folder.name

    folders = [f for f in run_dir.glob(ray_compat.CHECKPOINT_DIR_GLOB) if f.is_dir()]
    return sorted(folders, key=steps, reverse=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while chunk := stream.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


class Reporter(Protocol):
    """Where metrics and checkpoint folders go, and where the latest checkpoint comes from."""

    def report(self, metrics: dict[str, float], folder: Path | None) -> None:
        """Report metrics, with the checkpoint in ``folder`` (rank 0) or none (other ranks).
        Every rank calls this equally often: under Ray Train it is a barrier."""
        ...

    def registered(self) -> dict[str, Any] | None:
        """The latest checkpoint state this reporter knows of, or None; raises ``Unverified``
        when that checkpoint fails verification."""
        ...


class RayReporter:
    """Ray Train's ``report`` and ``get_checkpoint``: the production reporter."""

    def report(self, metrics: dict[str, float], folder: Path | None) -> None:
        import ray.train

        checkpoint = None if folder is None else ray.train.Checkpoint.from_directory(folder)
        ray.train.report(metrics, checkpoint=checkpoint)

    def registered(self) -> dict[str, Any] | None:
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return None
        with checkpoint.as_directory() as folder:
            return load(Path(folder))


class RunFolderReporter:
    """Checkpoints go into the run folder as Ray Train persists them (``checkpoint_<time>``,
    complete or not at all), the newest ``keep_last`` kept; like ``ray.train.report``, every
    report is a barrier of all ranks. The loop finds the latest checkpoint in the run folder
    itself (``latest``), so nothing is registered elsewhere: the reporter of the command's own
    workers and of warm workers."""

    def __init__(self, run_dir: Path, keep_last: int, rank: int) -> None:
        self.run_dir, self.keep_last, self.rank = run_dir, keep_last, rank
        self.last: dict[str, Any] = {}
        self.checkpoint: Path | None = None
        if rank == 0:
            run_dir.mkdir(parents=True, exist_ok=True)
            for partial in run_dir.glob(".checkpoint_*.partial"):  # from a killed run
                shutil.rmtree(partial, ignore_errors=True)

    def report(self, metrics: dict[str, float], folder: Path | None) -> None:
        import torch.distributed as dist

        from trainforge import distributed

        if folder is not None and self.rank == 0:
            name = "checkpoint_" + datetime.now().strftime("%Y-%m-%d_%H-%M-%S.%f")
            partial = self.run_dir / f".{name}.partial"
            try:
                shutil.copytree(folder, partial)
            except BaseException:  # a full disk: nothing half-copied stays behind
                shutil.rmtree(partial, ignore_errors=True)
                raise
            os.replace(partial, self.run_dir / name)  # complete, or not there at all
            self.checkpoint = self.run_dir / name
            self.last = {**metrics}
            self._prune()
        elif self.checkpoint is None:
            self.last = {**metrics}
        if distributed.several_ranks():
            dist.barrier()

    def registered(self) -> dict[str, Any] | None:
        return None  # the run folder is the registry

    def result(self) -> dict[str, Any]:
        return {"metrics": self.last, "checkpoint": str(self.checkpoint or "") or None}

    def _prune(self) -> None:
        # Timestamp names sort by time; Ray Train's folders from earlier runs share the format.
        folders = sorted(f for f in self.run_dir.glob(ray_compat.CHECKPOINT_DIR_GLOB) if f.is_dir())
        for old in folders[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)


class FolderReporter:
    """Copies checkpoints to ``root/checkpoint_NNNNNN`` (as Ray names them, so ``newest_in``
    finds them) and keeps the reported metrics in ``reports``: a loop without Ray."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.reports: list[dict[str, float]] = []

    def report(self, metrics: dict[str, float], folder: Path | None) -> None:
        self.reports.append(dict(metrics))
        if folder is not None:
            count = len(list(self.root.glob(ray_compat.CHECKPOINT_DIR_GLOB)))
            shutil.copytree(folder, self.root / f"checkpoint_{count:06d}")

    def registered(self) -> dict[str, Any] | None:
        return newest_in(self.root).state if self.root.exists() else None


def latest(reporter: Reporter, run_dir: str | None = None) -> Found:
    """The run's latest valid checkpoint state (None for a fresh run) and the broken ones passed
    over; raises ``NoValidCheckpoint`` when there are checkpoints and none is valid.

    Ray Train registers a reported checkpoint asynchronously (its controller picks the report up
    on its next poll); a worker that dies right after reporting can leave a persisted checkpoint
    unregistered. So the run folder is searched too and the further of the two wins: a saved
    checkpoint is never lost. A registered checkpoint that fails verification (Ray keeps it as
    the latest) is passed over like a broken folder on disk.
    """
    skipped: list[str] = []
    candidates = []
    try:
        registered = reporter.registered()
    except Unverified as exc:
        registered = None
        skipped.append(str(exc))
    if registered is not None:
        candidates.append(registered)
    run_folder = storage.local_folder(run_dir)
    if run_folder is not None:
        on_disk = newest_in(run_folder)  # names the registered folder again if it is broken
        skipped += [reason for reason in on_disk.skipped if reason not in skipped]
        if on_disk.state is not None:
            candidates.append(on_disk.state)
    best = max(candidates, key=lambda state: state["global_step"], default=None)
    if best is None and skipped:
        raise _none_valid(run_dir or "the run's storage", skipped)
    return Found(best, skipped)
