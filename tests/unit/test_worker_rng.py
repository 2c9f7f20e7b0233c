"""RNG streams of a worker (``trainforge.worker.rng``): captured into a checkpoint and restored,
one entry per rank."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from trainforge import checkpoint
from trainforge.distributed import WorkerContext
from trainforge.worker import rng

CPU = torch.device("cpu")


def ctx(rank: int = 0, world_size: int = 1) -> WorkerContext:
    return WorkerContext(rank=rank, local_rank=rank, world_size=world_size, node_rank=0, device=CPU)


def draws() -> tuple[list[float], list[float], list[float]]:
    return (
        [random.random() for _ in range(5)],
        np.random.rand(5).tolist(),
        torch.rand(5).tolist(),
    )


@pytest.fixture(autouse=True)
def keep_global_rng() -> Iterator[None]:
    """Put the global RNG streams back as they were, for the tests that follow."""
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    yield
    random.setstate(saved[0])
    np.random.set_state(saved[1])
    torch.set_rng_state(saved[2])


def test_rng_state_round_trip(tmp_path: Path) -> None:
    random.seed(11)
    np.random.seed(12)
    torch.manual_seed(13)
    np.random.randn()  # leave a cached gaussian in numpy's state
    state = rng.capture_rng(CPU)
    first = draws()
    second = draws()  # where the streams go on after `first`

    checkpoint.save(tmp_path, {"rng": [state]}, "")
    loaded = checkpoint.load(tmp_path)["rng"]
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    assert rng.restore_rng(loaded, ctx(0, 1)) is True
    assert draws() == first

    # the wrong number of states (world size changed) leaves the streams where they are: the
    # next draws are exactly those after `first` — neither `first` again (rewound) nor others
    assert rng.restore_rng(loaded * 2, ctx(0, 1)) is False
    assert rng.restore_rng([], ctx(0, 1)) is False
    assert draws() == second != first
    assert rng.restore_rng(loaded, ctx(0, 1)) is True
    assert draws() == first


def test_rng_state_picks_this_ranks_entry() -> None:
    states = []
    for seed in (1, 2):
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)
        states.append(rng.capture_rng(CPU))
    expected = draws()  # seed 2 streams
    assert rng.restore_rng(states, ctx(1, 2)) is True
    assert draws() == expected
