"""What a run waiting for the cluster's resources says (``driver/resource_wait.py``): only this
job's pending placement groups count, and the line names what they need and what is free."""

from __future__ import annotations

from trainforge.driver.resource_wait import describe, pending_needs, placed

JOB = "02000000"


def group(state: str, job: str, *bundles: dict[str, float]) -> tuple[str, dict]:
    group_id = "9f1c2a7b5e3d4c6a8b0e1f2d3c4b" + job
    return group_id, {"state": state, "bundles": dict(enumerate(bundles))}


def test_only_this_jobs_pending_groups_are_counted() -> None:
    ours = group("PENDING", JOB, {"CPU": 1.0}, {"CPU": 1.0, "GPU": 1.0})
    theirs = group("PENDING", "03000000", {"CPU": 8.0})
    assert pending_needs(dict([theirs]), JOB) is None  # another job waits, not this one
    assert pending_needs(dict([ours, theirs]), JOB) == {"CPU": 2.0, "GPU": 1.0}
    created = group("CREATED", JOB, {"CPU": 1.0})
    removed = group("REMOVED", JOB, {"CPU": 1.0})
    assert pending_needs(dict([created, removed]), JOB) is None
    assert pending_needs({}, JOB) is None


def test_a_group_placed_at_once_ends_the_watch() -> None:
    """Placed before the watcher first looked: it stops looking (it never saw one pending)."""
    assert placed(dict([group("CREATED", JOB, {"CPU": 1.0})]), JOB)
    assert not placed(dict([group("CREATED", "03000000", {"CPU": 1.0})]), JOB)
    assert not placed(dict([group("REMOVED", JOB, {"CPU": 1.0})]), JOB)


def test_the_line_names_what_the_run_needs_and_what_is_free() -> None:
    assert describe({"CPU": 2.0}, {}, {"CPU": 2.0}, 10.4) == (
        "workers: waiting for resources: the run needs 2 CPU; the cluster has 0 of 2 CPU free "
        "(10 s)"
    )
    assert describe(
        {"GPU": 4.0, "CPU": 2.0}, {"CPU": 1.5, "GPU": 1.0}, {"CPU": 16, "GPU": 4}, 70
    ) == (
        "workers: waiting for resources: the run needs 2 CPU and 4 GPU; the cluster has 1.5 of 16 "
        "CPU and 1 of 4 GPU free (70 s)"
    )
