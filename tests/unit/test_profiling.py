"""The profiler window (``trainforge.profiling``): rank 0 only, N steps from a start step, one
Chrome trace."""

from __future__ import annotations

import json

import torch

from trainforge.distributed import WorkerContext
from trainforge.profiling import StepProfiler

CPU = torch.device("cpu")


def ctx(rank: int) -> WorkerContext:
    return WorkerContext(rank=rank, local_rank=rank, world_size=2, node_rank=0, device=CPU)


def test_profiles_the_window_and_writes_a_chrome_trace() -> None:
    profiler = StepProfiler(steps=2, start_step=3, ctx=ctx(0))
    for step in range(1, 8):
        torch.randn(16, 16) @ torch.randn(16, 16)
        profiler.after_step(step)
        assert (profiler.profiler is not None) == (step >= 3)
        assert (profiler.trace is not None) == (step >= 5)  # steps 4 and 5 were profiled
    assert profiler.trace is not None
    assert "traceEvents" in json.loads(profiler.trace.read_text())
    profiler.stop()  # at the end of the run: nothing more to do


def test_other_ranks_and_zero_steps_do_not_profile() -> None:
    for profiler in (StepProfiler(2, 1, ctx(1)), StepProfiler(0, 1, ctx(0))):
        for step in range(1, 5):
            profiler.after_step(step)
        profiler.stop()
        assert profiler.profiler is None and profiler.trace is None
