"""Checkpoints: what is saved, when, and how it comes back.

Rank 0 writes one ``state.pt`` (model, optimizer, scheduler, scaler, position, every rank's RNG
state) plus the resolved recipe, and hands the folder to ``ray.train.report``, which persists it
under ``storage_path/run.name`` and keeps the last N. Re-running the same run name makes Ray
Train hand the latest one back through ``ray.train.get_checkpoint()``.

Everything saved is plain tensors, numbers and containers so that loading works with
``torch.load(weights_only=True)`` — no pickled code runs when a checkpoint is opened.
"""

from __future__ import annotations

import random
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainforge import ray_compat
from trainforge.distributed import WorkerContext, all_gather_objects

STATE_FILE = "state.pt"
RECIPE_FILE = "recipe.yaml"


@dataclass
class Position:
    """Where training stands: the next epoch to run and optimizer steps already done in it."""

    epoch: int = 0
    step_in_epoch: int = 0
    global_step: int = 0


class Checkpointer:
    def __init__(self, section: Any, ctx: WorkerContext, recipe_yaml: str) -> None:
        self.every_epochs = section.every_epochs
        self.every_steps = section.every_steps
        self.ctx = ctx
        self.recipe_yaml = recipe_yaml

    def due_after_step(self, global_step: int) -> bool:
        return self.every_steps is not None and global_step % self.every_steps == 0

    def due_after_epoch(self, epoch: int, last: bool) -> bool:
        return last or (epoch + 1) % self.every_epochs == 0

    def report(
        self,
        metrics: dict[str, float],
        state_fn: Callable[[], dict[str, Any]] | None,
    ) -> None:
        """Report metrics, with a checkpoint when ``state_fn`` is given. Every rank must call
        this at the same points: ``ray.train.report`` is a barrier."""
        import ray.train

        if state_fn is None:
            ray.train.report(metrics)
            return
        rng_states = all_gather_objects(capture_rng(self.ctx.device), self.ctx.world_size)
        if not self.ctx.is_main:
            ray.train.report(metrics)
            return
        with tempfile.TemporaryDirectory(prefix="trainforge-ckpt-") as folder:
            save(Path(folder), {**state_fn(), "rng": rng_states}, self.recipe_yaml)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(folder))

    def latest(self, run_dir: str | None = None) -> dict[str, Any] | None:
        """The run's latest checkpoint state, or None for a fresh run.

        Ray Train registers a reported checkpoint asynchronously (its controller picks the
        report up on its next poll); a worker that dies right after reporting can leave a
        persisted checkpoint unregistered. So the run folder is searched too and the further
        of the two wins: a saved checkpoint is never lost.
        """
        import ray.train

        candidates = []
        checkpoint = ray.train.get_checkpoint()
        if checkpoint is not None:
            with checkpoint.as_directory() as folder:
                candidates.append(load(Path(folder)))
        if run_dir is not None and "://" not in run_dir:
            on_disk = newest_in(Path(run_dir))
            if on_disk is not None:
                candidates.append(on_disk)
        return max(candidates, key=lambda state: state["global_step"], default=None)


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


def save(folder: Path, state: dict[str, Any], recipe_yaml: str) -> None:
    torch.save(state, folder / STATE_FILE)
    (folder / RECIPE_FILE).write_text(recipe_yaml)


def load(folder: Path | str) -> dict[str, Any]:
    return torch.load(Path(folder) / STATE_FILE, map_location="cpu", weights_only=True)


def capture_rng(device: torch.device) -> dict[str, Any]:
    np_state = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {
            "keys": torch.from_numpy(np_state[1].astype(np.int64)),
            "pos": int(np_state[2]),
            "has_gauss": int(np_state[3]),
            "cached_gaussian": float(np_state[4]),
        },
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state(device) if device.type == "cuda" else None,
    }


def restore_rng(states: list[dict[str, Any]], ctx: WorkerContext) -> bool:
    """Restore this rank's RNG streams; False when the world size changed (streams reseeded)."""
    if len(states) != ctx.world_size:
        return False
    state = states[ctx.rank]
    random.setstate(_as_tuple(state["python"]))
    np_state = state["numpy"]
    np.random.set_state(
        (
            "MT19937",
            np_state["keys"].numpy().astype(np.uint32),
            np_state["pos"],
            np_state["has_gauss"],
            np_state["cached_gaussian"],
        )
    )
    torch.set_rng_state(state["torch"])
    if ctx.device.type == "cuda" and state["cuda"] is not None:
        torch.cuda.set_rng_state(state["cuda"], ctx.device)
    return True


def _as_tuple(value: Any) -> Any:
    # random.setstate needs tuples all the way down; a round trip may hand back lists.
    if isinstance(value, list | tuple):
        return tuple(_as_tuple(v) for v in value)
    return value
