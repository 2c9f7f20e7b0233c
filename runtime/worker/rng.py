"""Random-number streams of a worker: seeding, and capturing and restoring them for checkpoints.

A checkpoint holds every rank's Python, NumPy, torch and CUDA generator states (gathered to
rank 0), so a resumed run draws the same augmentations and dropout masks as an uninterrupted
one. The states are plain tensors and numbers: they load with ``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import random
from typing import Any, cast

import numpy as np
import torch

from trainforge.distributed import WorkerContext, all_gather_objects


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def capture_rng(device: torch.device) -> dict[str, Any]:
    """This process's generator states (the CUDA one of ``device`` when it is a GPU)."""
    np_state = cast(tuple[Any, ...], np.random.get_state())  # the legacy tuple form
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


def gather_rng(ctx: WorkerContext) -> list[dict[str, Any]]:
    """Every rank's generator states, in rank order. A collective: every rank calls it."""
    return all_gather_objects(capture_rng(ctx.device), ctx.world_size)


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


def resume_rng(states: list[dict[str, Any]], global_step: int, ctx: WorkerContext) -> None:
    """This rank's saved streams; after a change of world size there is no saved stream for
    this rank, so fresh ones are seeded from the step (deterministic, but not the old run's)."""
    if not restore_rng(states, ctx):
        seed_everything(global_step * 1000 + ctx.rank)


def _as_tuple(value: Any) -> Any:
    # random.setstate needs tuples all the way down; a round trip may hand back lists.
    if isinstance(value, list | tuple):
        return tuple(_as_tuple(v) for v in value)
    return value
