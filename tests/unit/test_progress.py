"""Progress from rank 0 (``trainforge.progress``): its first line, then step, epoch and finish
events that stand for plain lines (``progress_events.text``) with the resume point, loss,
throughput and an ETA that is an upper bound under early stopping."""

from __future__ import annotations

import time

import pytest
import torch

from trainforge import progress_events
from trainforge.checkpoint import Position
from trainforge.distributed import WorkerContext
from trainforge.progress import Progress

CPU = torch.device("cpu")


def progress(rank: int = 0, early_stopping: bool = False) -> Progress:
    ctx = WorkerContext(rank=rank, local_rank=rank, world_size=2, node_rank=0, device=CPU)
    return Progress(ctx, 100, 4, 64, {"model": "simple_cnn"}, early_stopping)


def test_lines_from_rank_0(capsys: pytest.CaptureFixture[str]) -> None:
    lines = progress(early_stopping=True)
    before = time.perf_counter()
    lines.start(Position(1, 5, 30))
    time.sleep(0.05)  # 5 steps "took" at least this long
    metrics = lines.step_metrics(Position(1, 10, 35), steps=5)
    elapsed = time.perf_counter() - before
    # step_ms is the time since start() over the 5 steps; samples/s is 5 global batches of 64
    # over that same time
    assert 0.05 * 1000 / 5 <= metrics["perf/step_ms"] <= elapsed * 1000 / 5
    assert metrics["perf/samples_per_s"] * metrics["perf/step_ms"] / 1000 == pytest.approx(64)
    lines.log_step(Position(1, 10, 35), {"train/loss": 0.5, "train/lr": 1e-3, **metrics})
    lines.log_epoch(1, {"train/loss": 0.5, "val/loss": 0.25, "perf/step_ms": 1.0})
    lines.note("early stop")
    lines.finish(Position(2, 0, 50))
    written = capsys.readouterr().out.splitlines()
    # the step, the epoch and the finish are events, not text for the driver to parse
    events = [progress_events.read(line) for line in written]
    assert [event and event["kind"] for event in events] == [None, "step", "epoch", None, "finish"]
    assert events[1] is not None and (events[1]["step"], events[1]["total"]) == (35, 100)
    # each stands for the plain line a log shows
    out = [progress_events.as_text(line) for line in written]
    assert out[0].startswith("[trainforge] training 100 steps over 4 epochs on 2 workers (cpu)")
    assert "global batch 64, resuming at epoch 2 step 30; model=simple_cnn" in out[0]
    assert out[1].startswith("[trainforge] epoch 2/4 step 35/100 loss 0.5000 lr 1.00e-03 ")
    assert " eta ≤ " in out[1]  # with early stopping the planned steps are an upper bound
    assert out[2] == "[trainforge] epoch 2/4 done: train/loss 0.5000 val/loss 0.2500"
    assert out[3] == "[trainforge] early stop"
    assert out[4].startswith("[trainforge] finished at step 50 in ")
    assert out[4].endswith(" samples/s")  # 20 steps in this attempt


def test_other_ranks_are_quiet(capsys: pytest.CaptureFixture[str]) -> None:
    lines = progress(rank=1)
    lines.start(Position())
    lines.note("early stop")
    lines.finish(Position())
    assert capsys.readouterr().out == ""


def test_one_epoch_on_one_worker_is_said_in_the_singular(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ctx = WorkerContext(rank=0, local_rank=0, world_size=1, node_rank=0, device=CPU)
    Progress(ctx, 18, 1, 200, {}).start(Position(0, 0, 0))
    line = capsys.readouterr().out.splitlines()[0]
    assert line.startswith("[trainforge] training 18 steps over 1 epoch on 1 worker (cpu), ")
    assert line.endswith("global batch 200")  # a workload with nothing to describe: no "; "
