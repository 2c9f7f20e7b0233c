"""How the simulation stage cuts N simulations into chunks and spreads them over the cluster.

Two sizes, kept apart on purpose:

- A **chunk** is the unit of the result: one seed, one file in the cache. Its size depends on N
  and the recipe only, never on the cluster, so a recipe gives the same simulations on a laptop
  and on 64 cores, and a stage interrupted on one cluster resumes on another. A simulator that
  is not vectorised (per-sample code, milliseconds a row) gets small chunks — at most
  ``MAX_CHUNKS`` of them, at least ``MIN_CHUNK_ROWS`` rows each, at most the recipe's
  ``chunk_size`` — so that there are enough to keep many cores busy to the end; a vectorised
  one gets ``chunk_size`` (one call simulates a whole chunk quickly).
- A **task** (one Ray task holding one CPU, or one GPU) simulates a few chunks. How many
  follows the cluster and the simulator's cost, measured on the chunks done so far: until a
  chunk per slot is measured, tasks of one chunk each are the pilot; then a task takes
  its share of what is left (guided self-scheduling: ``1 / (SHARES · slots)`` of the remaining
  chunks, so tasks shrink towards the end and every core finishes at about the same time),
  but never less than ``MIN_TASK_SECONDS`` of work (Ray's cost per task, ~4 ms between one
  task's end and the next one's start on a worker, stays small beside it) nor more than
  ``MAX_TASK_SECONDS`` (progress shows, and an interruption loses little). On several slots
  the stage's last tasks end at different times, and the slots that are done wait for the
  others: about half a last task each. So the minimum is short there (0.05 s: the last tasks
  are single chunks of a per-sample simulator): on 4-16 cores of a GPU host, the slots'
  seconds outside their chunks fell from 4.4-6.6% of a 3-5 s stage at 0.25 s to 2.5-3.3%,
  mostly the wait at the end. Tasks shrink on a cluster
  of one slot too, to ``MIN_TASK_SECONDS_ONE_SLOT``: there is nothing to balance, but the
  driver writes each chunk to the cache after its task returns, and what the last task returns
  is written while nothing simulates (a 5 s last task's ~200 chunk files: tens of
  milliseconds); there a shorter minimum only adds task
  ends.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIN_CHUNK_ROWS = 16
MAX_CHUNKS = 1024
MIN_TASK_SECONDS = 0.05
MIN_TASK_SECONDS_ONE_SLOT = 0.25
MAX_TASK_SECONDS = 5.0
MAX_TASK_ROWS = 1_000_000  # what one task's result may hold (vectorised simulators are fast)
SHARES = 2
IN_FLIGHT = 2  # tasks submitted per slot: a core finishing one finds the next already queued


def chunk_rows(num_simulations: int, chunk_size: int, vectorized: bool) -> int:
    """Simulations per chunk (the last chunk holds what is left)."""
    if vectorized:
        return chunk_size
    return min(chunk_size, max(MIN_CHUNK_ROWS, math.ceil(num_simulations / MAX_CHUNKS)))


def chunk_sizes(num_simulations: int, rows: int) -> list[int]:
    """Each chunk's size: ``rows`` each, the last one what is left."""
    return [min(rows, num_simulations - s) for s in range(0, num_simulations, rows)]


def slots(cluster: dict[str, float], device: str, cpus_per_chunk: float) -> int:
    """Tasks the cluster runs at once: its GPUs, or its CPUs over what a task reserves."""
    if device == "cuda":
        return max(1, int(cluster.get("GPU", 0)))
    return max(1, int(cluster.get("CPU", 1) // cpus_per_chunk))


@dataclass
class TaskSizer:
    """Chunks per task, from the simulation seconds measured so far (see the module's text)."""

    slots: int
    rows_per_chunk: int
    seconds: float = 0.0
    simulations: int = 0

    def record(self, simulations: int, seconds: float) -> None:
        self.simulations += simulations
        self.seconds += seconds

    @property
    def seconds_per_simulation(self) -> float | None:
        """Measured once a chunk per slot is done: the first results are the cheapest chunks
        (they finish first), and an estimate from them alone makes tasks far too large."""
        if self.simulations < self.slots * self.rows_per_chunk:
            return None
        return self.seconds / self.simulations

    def next_size(self, remaining_chunks: int) -> int:
        cost = self.seconds_per_simulation
        if cost is None:
            return min(1, remaining_chunks)  # the pilot
        chunk_seconds = max(cost * self.rows_per_chunk, 1e-9)
        shortest = MIN_TASK_SECONDS if self.slots > 1 else MIN_TASK_SECONDS_ONE_SLOT
        least = math.ceil(shortest / chunk_seconds)
        most = max(least, int(MAX_TASK_SECONDS / chunk_seconds))
        most = min(most, max(1, MAX_TASK_ROWS // self.rows_per_chunk))
        share = math.ceil(remaining_chunks / (SHARES * self.slots))
        return max(1, min(remaining_chunks, most, max(least, share)))
