"""Checkpoint files, and where they go.

A checkpoint is one folder: ``state.pt`` (the train state — model, optimizer, scheduler, scaler,
position, early stopping, every rank's RNG state; see ``trainforge.worker.state``) plus the
resolved recipe. Everything in ``state.pt`` is plain tensors, numbers and containers, so it
loads with ``torch.load(weights_only=True)`` — no pickled code runs when a checkpoint is opened —
and ``load(path)["model"]`` is a plain state dict.

A ``Reporter`` takes the folder away: ``RayReporter`` hands it to ``ray.train.report``, which
persists it under ``storage_path/run.name`` as ``checkpoint_*`` and keeps the last N; re-running
the same run name makes Ray Train hand the latest one back. ``FolderReporter`` copies it into a
local folder (a worker loop run without Ray, as the tests do).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from trainforge import ray_compat, storage

STATE_FILE = "state.pt"
RECIPE_FILE = "recipe.yaml"


@dataclass
class Position:
    """Where training stands: the next epoch to run and optimizer steps already done in it."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0


def save(folder: Path, state: dict[str, Any], recipe_yaml: str) -> None:
    torch.save(state, folder / STATE_FILE)
    (folder / RECIPE_FILE).write_text(recipe_yaml)


def load(folder: Path | str) -> dict[str, Any]:
    return torch.load(Path(folder) / STATE_FILE, map_location="cpu", weights_only=True)


def newest_in(run_dir: Path) -> dict[str, Any] | None:
    """The checkpoint in ``run_dir`` with the most optimizer steps; unreadable ones (a copy cut
    short by a crash) are skipped."""
    best: dict[str, Any] | None = None
    for folder in run_dir.glob(ray_compat.CHECKPOINT_DIR_GLOB):
        try:
            state = load(folder)
        except Exception:
            continue
        if best is None or state["global_step"] > best["global_step"]:
            best = state
    return best


class Reporter(Protocol):
    """Where metrics and checkpoint folders go, and where the latest checkpoint comes from."""

    def report(self, metrics: dict[str, float], folder: Path | None) -> None:
        """Report metrics, with the checkpoint in ``folder`` (rank 0) or none (other ranks).
        Every rank calls this equally often: under Ray Train it is a barrier."""
        ...

    def registered(self) -> dict[str, Any] | None:
        """The latest checkpoint state this reporter knows of, or None."""
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
        return newest_in(self.root) if self.root.exists() else None


def latest(reporter: Reporter, run_dir: str | None = None) -> dict[str, Any] | None:
    """The run's latest checkpoint state, or None for a fresh run.

    Ray Train registers a reported checkpoint asynchronously (its controller picks the report up
    on its next poll); a worker that dies right after reporting can leave a persisted checkpoint
    unregistered. So the run folder is searched too and the further of the two wins: a saved
    checkpoint is never lost.
    """
    candidates = []
    registered = reporter.registered()
    if registered is not None:
        candidates.append(registered)
    run_folder = storage.local_folder(run_dir)
    if run_folder is not None:
        on_disk = newest_in(run_folder)
        if on_disk is not None:
            candidates.append(on_disk)
    return max(candidates, key=lambda state: state["global_step"], default=None)
