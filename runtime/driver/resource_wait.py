"""A line while a run's workers wait for the cluster's CPUs or GPUs.

Ray Train places a run's worker group with a placement group, which stays pending, silently,
while other work holds what it needs (or until an autoscaler adds a node): on a busy shared
cluster a command printed nothing between its MLflow line and its workers' start — 100 s in a
run here whose CPUs another actor held. A restart after a failure (``run.max_failures``) places
a new group the same way, and waits the same way where the failed node took its CPUs or GPUs
with it. For the whole of each Ray Train ``fit()`` a thread looks at this job's placement groups
(a placement group's ID ends with its job's ID): one that stays pending for ``FIRST_S`` is said,
with what the run needs and what the cluster has free, and again every ``EVERY_S`` while it
waits. Once a group is placed it looks less often (``PLACED_POLL_S``): only a restart's group
can be pending then.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from trainforge import log

FIRST_S = 10.0
"""How long a placement may take before the command says that it waits."""
EVERY_S = 60.0
"""How often it says so again while it waits."""
POLL_S = 1.0
"""How often it looks while the workers start."""
PLACED_POLL_S = 5.0
"""How often it looks once they have started (for a restart's group)."""


@contextlib.contextmanager
def said_while_pending(restart: bool = False) -> Iterator[None]:
    """Around Ray Train's ``fit()``: says what the workers wait for, if they wait (at the start,
    or, where the ``fit()`` is a ``restart``, as a restart's)."""
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(stop, restart), name="trainforge-placement",
                               daemon=True)  # fmt: skip
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join(timeout=5)


def pending_needs(table: dict[str, dict[str, Any]], job_id: str) -> dict[str, float] | None:
    """What this job's pending placement groups ask for in all (resource → amount), or None
    when none of its groups is pending. ``table``: ``ray.util.placement_group_table()``."""
    needs: dict[str, float] = {}
    pending = False
    for group_id, group in table.items():
        if not group_id.endswith(job_id) or group.get("state") != "PENDING":
            continue  # another job's (a shared cluster), or placed, or removed
        pending = True
        for bundle in group.get("bundles", {}).values():
            for resource, amount in bundle.items():
                needs[resource] = needs.get(resource, 0.0) + amount
    return needs if pending else None


def placed(table: dict[str, dict[str, Any]], job_id: str) -> bool:
    """Whether one of this job's placement groups is placed (its workers can start)."""
    return any(
        group_id.endswith(job_id) and group.get("state") == "CREATED"
        for group_id, group in table.items()
    )


def describe(needs: dict[str, float], free: dict[str, float], total: dict[str, float],
             waited_s: float, restart: bool = False) -> str:  # fmt: skip
    """``workers: waiting for resources: the run needs 2 CPU; the cluster has 0 of 2 CPU
    free (10 s)`` (``waiting for resources to restart`` for a restart's group)."""
    names = sorted(needs)
    wanted = " and ".join(f"{needs[name]:g} {name}" for name in names)
    has = " and ".join(f"{free.get(name, 0):g} of {total.get(name, 0):g} {name}" for name in names)
    return (
        f"workers: waiting for resources{' to restart' if restart else ''}: the run needs "
        f"{wanted}; the cluster has {has} free ({waited_s:.0f} s)"
    )


@dataclass
class Watch:
    """What the thread knows of this job's groups from one look (``look``) to the next."""

    job_id: str
    pending_since: float | None = None  # when the group now pending was first seen so
    next_line_at: float = 0.0
    placements: int = 0  # groups seen placed: after the first, a pending group is a restart's

    def look(
        self, table: dict[str, dict[str, Any]], now: float
    ) -> tuple[dict[str, float], float] | None:
        """What the pending group needs and how long it has waited, when it is time to say so;
        else None."""
        needs = pending_needs(table, self.job_id)
        if needs is None:
            first_placed = self.placements == 0 and placed(table, self.job_id)
            if self.pending_since is not None or first_placed:
                self.placements += 1  # placed (perhaps before the first look)
            self.pending_since = None
            return None
        if self.pending_since is None:
            self.pending_since, self.next_line_at = now, now + FIRST_S
        if now < self.next_line_at:
            return None
        self.next_line_at = now + EVERY_S
        return needs, now - self.pending_since


def _watch(stop: threading.Event, restart: bool) -> None:
    import ray

    watch = Watch(ray.get_runtime_context().get_job_id(), placements=int(restart))
    while not stop.wait(PLACED_POLL_S if watch.placements else POLL_S):
        try:
            due = watch.look(ray.util.placement_group_table(), time.monotonic())
            if due is not None:
                needs, waited_s = due
                free, total = ray.available_resources(), ray.cluster_resources()
                log.say(describe(needs, free, total, waited_s, restart=watch.placements > 0))
        except Exception:  # the line is a courtesy: the run never depends on it
            return
