"""A line while a run's workers wait for the cluster's CPUs or GPUs.

Ray Train places a run's worker group with a placement group, which stays pending, silently,
while other work holds what it needs (or until an autoscaler adds a node): on a busy shared
cluster a command printed nothing between its MLflow line and its workers' start — 100 s in a
run here whose CPUs another actor held. While Ray Train's ``fit()`` starts the workers, a thread
looks at this job's placement groups (a placement group's ID ends with its job's ID): one that
stays pending for ``FIRST_S`` is said, with what the run needs and what the cluster has free,
and again every ``EVERY_S`` while it waits. Once the group is placed the thread ends.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

from trainforge import log

FIRST_S = 10.0
"""How long a placement may take before the command says that it waits."""
EVERY_S = 60.0
"""How often it says so again while it waits."""
POLL_S = 1.0


@contextlib.contextmanager
def said_while_pending() -> Iterator[None]:
    """Around the call that starts the run's workers: says what they wait for, if they wait."""
    stop = threading.Event()
    watcher = threading.Thread(target=_watch, args=(stop,), name="trainforge-placement",
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
             waited_s: float) -> str:  # fmt: skip
    """``workers: waiting for resources: the run needs 2 CPU; the cluster has 0 of 2 CPU
    free (10 s)``."""
    names = sorted(needs)
    wanted = " and ".join(f"{needs[name]:g} {name}" for name in names)
    has = " and ".join(f"{free.get(name, 0):g} of {total.get(name, 0):g} {name}" for name in names)
    return (
        f"workers: waiting for resources: the run needs {wanted}; the cluster has {has} free "
        f"({waited_s:.0f} s)"
    )


def _watch(stop: threading.Event) -> None:
    import ray

    job_id = ray.get_runtime_context().get_job_id()
    pending_since: float | None = None
    next_line_at = 0.0
    while not stop.wait(POLL_S):
        try:
            table = ray.util.placement_group_table()
            needs = pending_needs(table, job_id)
            if needs is None:
                if pending_since is not None or placed(table, job_id):
                    return  # placed: the workers start now
                continue  # Ray Train has not asked for the group yet
            now = time.monotonic()
            if pending_since is None:
                pending_since, next_line_at = now, now + FIRST_S
            if now >= next_line_at:
                free, total = ray.available_resources(), ray.cluster_resources()
                log.say(describe(needs, free, total, now - pending_since))
                next_line_at = now + EVERY_S
        except Exception:  # the line is a courtesy: the run never depends on it
            return
