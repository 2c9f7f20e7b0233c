"""How the simulation stage cuts simulations into chunks (``trainforge.workloads.sbi.chunking``):
chunk sizes from N and the recipe only, slots from the cluster, and task sizes from the measured
cost that keep every slot busy to the end without drowning in per-task overhead."""

from __future__ import annotations

import heapq
import random

import pytest

from trainforge.workloads.sbi import chunking


@pytest.mark.parametrize(
    ("num_simulations", "chunk_size", "vectorized", "rows"),
    [
        (400, 100_000, False, 16),  # at least 16 rows a chunk
        (5_000, 100_000, False, 16),
        (1_000_000, 100_000, False, 977),  # at most 1,024 chunks: ceil(10^6 / 1024)
        (1_000_000, 500, False, 500),  # the recipe's chunk_size caps it
        (1_000_000, 100_000, True, 100_000),  # vectorised: one call per recipe chunk
    ],
)
def test_chunk_rows_depend_on_n_and_the_recipe_only(
    num_simulations: int, chunk_size: int, vectorized: bool, rows: int
) -> None:
    assert chunking.chunk_rows(num_simulations, chunk_size, vectorized) == rows


def test_chunk_sizes_cover_n_with_the_rest_last() -> None:
    assert chunking.chunk_sizes(50, 16) == [16, 16, 16, 2]
    assert chunking.chunk_sizes(32, 16) == [16, 16]


def test_slots_are_cpus_over_what_a_task_reserves_or_gpus() -> None:
    assert chunking.slots({"CPU": 32.0, "GPU": 4.0}, "cpu", 1.0) == 32
    assert chunking.slots({"CPU": 32.0}, "cpu", 2.0) == 16
    assert chunking.slots({"CPU": 32.0, "GPU": 4.0}, "cuda", 1.0) == 4
    assert chunking.slots({"CPU": 0.5}, "cpu", 1.0) == 1


def test_task_sizes_follow_the_measured_cost() -> None:
    sizer = chunking.TaskSizer(slots=32, rows_per_chunk=16)
    assert sizer.next_size(1000) == 1  # the pilot: nothing measured yet
    sizer.record(31 * 16, 31 * 0.032)
    assert sizer.next_size(1000) == 1  # …until a chunk per slot is measured
    sizer.record(16, 0.032)  # 2 ms a simulation: 32 ms a chunk
    assert sizer.next_size(1000) == 16  # its share: ceil(1000 / (2 * 32))
    assert sizer.next_size(100) == 2  # its share, ceil(100 / 64)
    assert sizer.next_size(10) == 2  # at least 0.05 s of work: ceil(0.05 / 0.032)
    assert sizer.next_size(1) == 1
    fast = chunking.TaskSizer(slots=32, rows_per_chunk=16)
    fast.record(16_000, 0.016)  # 1 µs a simulation: rows, not seconds, cap a task
    assert fast.next_size(10**7) == chunking.MAX_TASK_ROWS // 16
    one = chunking.TaskSizer(slots=1, rows_per_chunk=16)
    one.record(16, 0.032)
    # one slot's tasks shrink too: the last task's chunks are written while nothing simulates
    assert one.next_size(1000) == int(chunking.MAX_TASK_SECONDS / 0.032)
    assert one.next_size(100) == 50
    assert one.next_size(10) == 8  # MIN_TASK_SECONDS_ONE_SLOT of work, not fewer
    assert one.next_size(3) == 3
    slow = chunking.TaskSizer(slots=2, rows_per_chunk=16)
    slow.record(32, 320.0)  # 10 s a simulation: one chunk a task
    assert slow.next_size(1000) == 1


def _makespan(chunk_seconds: list[float], slots: int, rows: int) -> float:
    """The stage's loop with Ray replaced by a clock: IN_FLIGHT tasks per slot, each slot
    taking queued tasks in order, sizes from the sizer as results arrive."""
    sizer = chunking.TaskSizer(slots, rows)
    todo = list(chunk_seconds)
    queued: list[list[float]] = []
    free = [0.0] * slots  # when each slot is next idle
    running: list[tuple[float, int, float]] = []  # (finish time, chunks, seconds)
    now = 0.0
    while todo or queued or running:
        while todo and len(queued) + len(running) < chunking.IN_FLIGHT * slots:
            size = sizer.next_size(len(todo))
            queued.append(todo[:size])
            del todo[:size]
        while queued and min(free) <= now:
            slot = free.index(min(free))
            task = queued.pop(0)
            free[slot] = now + sum(task)
            heapq.heappush(running, (free[slot], len(task), sum(task)))
        now, size, seconds = heapq.heappop(running)
        sizer.record(size * rows, seconds)
    return now


@pytest.mark.parametrize("slots", [1, 2, 8, 32, 64, 256])
@pytest.mark.parametrize("spread", [0.0, 1.0])
@pytest.mark.parametrize("mean_seconds", [0.032, 0.3])
def test_every_slot_stays_busy_to_the_end(slots: int, spread: float, mean_seconds: float) -> None:
    """1,024 chunks of 16 simulations at 2 or ~20 ms each, equal or log-normally spread
    (σ = 1: some parameters solve 10x slower): the stage ends at most a minimal task and a
    chunk after the work divided over the slots (on one slot, when the work is done)."""
    costs = [mean_seconds * random.Random(i).lognormvariate(0, spread) for i in range(1024)]
    ideal = sum(costs) / slots
    limit = 1.02 * ideal + (chunking.MIN_TASK_SECONDS + max(costs) if slots > 1 else 0.0)
    assert _makespan(costs, slots, 16) <= limit


@pytest.mark.parametrize("slots", [2, 8, 32, 64])
def test_on_several_slots_the_last_tasks_end_within_a_chunk_of_each_other(slots: int) -> None:
    """Equal chunks of 32 ms: the last tasks are single chunks, so the stage ends at most one
    chunk after the work divided over the slots (with 0.25 s last tasks the slots that were
    done waited 2-5 chunks, on 4-16 cores of a GPU host 2-4% of a stage's slot-seconds:
    bench/results, forty-first session)."""
    costs = [0.032] * 1024
    assert _makespan(costs, slots, 16) <= sum(costs) / slots + 0.032 + 1e-9


def test_the_stages_progress_line_shows_a_pace_only_once_there_is_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first task's chunks are in after the workers' start: no "0/s" line from them."""
    from trainforge.workloads.sbi import progress as stage_lines

    clock = [0.0]
    monkeypatch.setattr(stage_lines.time, "monotonic", lambda: clock[0])
    lines: list[str] = []
    progress = stage_lines.Progress(20_000, 0, lines.append, started=0.0, last=0.0)
    clock[0] = 6.0  # the first task, after the workers started
    progress.add(2_500, {"node:1"})
    clock[0] = 12.0
    progress.add(5_000, {"node:1", "node:2"})
    assert lines == [
        "simulations: 2,500/20,000 (12%) on 1 process",
        "simulations: 7,500/20,000 (38%), 833/s on 2 processes, ETA 15 s",
    ]


def test_the_stages_pace_is_its_processes_at_their_measured_speed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Five seconds in, only one-chunk pilots have come back while long tasks run: the pace is
    each process's speed in its chunks' own seconds, not the few finished simulations over the
    time since the first (which said 41/s, ETA 71 s, of a stage done five seconds later). More
    processes than the cluster runs at once (a replaced worker) do not count twice."""
    from trainforge.workloads.sbi import progress as stage_lines

    clock = [0.0]
    monkeypatch.setattr(stage_lines.time, "monotonic", lambda: clock[0])
    lines: list[str] = []
    progress = stage_lines.Progress(3_000, 0, lines.append, started=0.0, last=0.0, slots=2)
    clock[0] = 3.5
    progress.add(16, {"node:1"}, 0.032)
    clock[0] = 5.0
    progress.add(64, {"node:1", "node:2"}, 0.128)  # 2 ms a simulation in each process
    clock[0] = 10.0
    progress.add(920, {"node:3"}, 1.84)  # a third process, in a cluster of two slots
    assert lines == [
        "simulations: 80/3,000 (3%), 1,000/s on 2 processes, ETA 3 s",
        "simulations: 1,000/3,000 (33%), 1,000/s on 3 processes, ETA 2 s",
    ]


def test_the_stages_last_line_counts_processes_and_nodes_in_words(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trainforge.workloads.sbi import progress as stage_lines

    clock = [0.0]
    monkeypatch.setattr(stage_lines.time, "monotonic", lambda: clock[0])
    manifest = {"invalid": 0}
    lines: list[str] = []
    alone = stage_lines.Progress(400, 0, lines.append, started=0.0, last=0.0)
    alone.add(400, {"nodeA:11"})
    clock[0] = 2.0
    alone.finish(manifest)
    several = stage_lines.Progress(400, 0, lines.append, started=0.0, last=2.0)
    several.add(400, {"nodeA:11", "nodeA:12", "nodeB:13"})
    several.finish(manifest)
    assert lines == [
        "simulations: 400 in 2.0 s (200/s) by 1 process on 1 node",
        "simulations: 400 in 2.0 s (200/s) by 3 processes on 2 nodes",
    ]
