"""The simulation stage's console lines: done / total, pace and ETA every few seconds, where the
work ran and what was invalid at the end."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from trainforge import log
from trainforge.workloads.sbi.simulations import invalid_summary

PROGRESS_EVERY_S = 5.0


@dataclass
class Progress:
    """The lines of one stage (``simulate.py``)."""

    total: int
    done: int
    say: Callable[[str], None]
    started: float = field(default_factory=time.monotonic)
    last: float = field(default_factory=time.monotonic)
    slots: int = 0  # tasks the cluster runs at once (0: not known)
    simulated: int = 0  # by this run (not a resumed entry's earlier chunks)
    simulator_seconds: float = 0.0  # the chunks' own (0: not known, as for GPU chunks)
    first: tuple[float, int] | None = None  # (when, simulated) at the first finished task
    workers: set[str] = field(default_factory=set)

    def add(self, simulations: int, workers: set[str], seconds: float = 0.0) -> None:
        """A task's chunks are in: ``simulations`` by ``workers`` in ``seconds`` of their own."""
        now = time.monotonic()
        self.done += simulations
        self.simulated += simulations
        self.simulator_seconds += seconds
        self.workers |= workers
        if self.first is None:
            self.first = (now, self.simulated)
        if now - self.last >= PROGRESS_EVERY_S and self.done < self.total:
            self.last = now
            rate = self.pace(now)
            pace = f", {rate:,.0f}/s" if rate > 0 else ""  # nothing to tell it from yet
            eta = f", ETA {(self.total - self.done) / rate:.0f} s" if rate > 0 else ""
            self.say(
                f"simulations: {self.done:,}/{self.total:,} ({self.done / self.total:.0%})"
                f"{pace} on {log.counted(len(self.workers), 'process', 'processes')}{eta}"
            )

    def pace(self, now: float) -> float:
        """Simulations per second now (0: not known yet). Where the chunks' own seconds are
        known: every process seen so far at the speed measured in its chunks. Counting finished
        tasks instead lags behind the work in flight — a stage's first tasks are one-chunk
        pilots, the next ones seconds long — and said 41/s, ETA 71 s, five seconds into a
        stage that was done five seconds later. Else: the finished tasks' rate since the first
        one (the workers' start is not the pace)."""
        if self.simulator_seconds > 0:
            processes = min(len(self.workers), self.slots or len(self.workers))
            return processes * self.simulated / self.simulator_seconds
        assert self.first is not None
        since, before = self.first
        return (self.simulated - before) / max(now - since, 1e-9)

    def finish(self, manifest: dict[str, Any]) -> None:
        if self.simulated:
            seconds = time.monotonic() - self.started
            nodes = {w.split(":")[0] for w in self.workers}
            self.say(
                f"simulations: {self.simulated:,} in {seconds:.1f} s "
                f"({self.simulated / max(seconds, 1e-9):,.0f}/s) by "
                f"{log.counted(len(self.workers), 'process', 'processes')} on "
                f"{log.counted(len(nodes), 'node', 'nodes')}"
            )
        if manifest["invalid"]:
            self.say(f"simulations: {invalid_summary(manifest)}")
