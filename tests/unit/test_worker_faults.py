"""Faults injected for tests (``trainforge.worker.faults``): an out-of-memory error raised by
the last rank's step at the step asked for, and nothing otherwise."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trainforge.checkpoint import Position
from trainforge.distributed import WorkerContext
from trainforge.worker import faults


def trainer(rank: int, world_size: int) -> SimpleNamespace:
    ctx = WorkerContext(rank, rank, world_size, 0, torch.device("cpu"))
    step = lambda window, measure_norm=False: (torch.tensor(len(window)), None)  # noqa: E731
    return SimpleNamespace(ctx=ctx, step=step, state=SimpleNamespace(position=Position()))


def test_the_last_rank_runs_out_of_memory_at_the_step_asked_for() -> None:
    first, last = trainer(0, 2), trainer(1, 2)
    for each in (first, last):
        faults.inject({faults.OOM_AT_STEP: 3}, each)
    untouched = trainer(1, 2)
    faults.inject({}, untouched)
    position = last.state.position
    for done in range(2):
        position.global_step = done
        assert last.step([1, 2])[0].item() == 2  # steps 1 and 2 run
    position.global_step = 2
    with pytest.raises(torch.OutOfMemoryError, match="injected at step 3"):
        last.step([1])
    first.state.position.global_step = untouched.state.position.global_step = 2
    assert first.step([1])[0].item() == untouched.step([1])[0].item() == 1
