"""What a run waiting for the cluster's resources says (``driver/resource_wait.py``): only this
job's pending placement groups count, the line names what they need and what is free, and a
group pending after one was placed is a restart's."""

from __future__ import annotations

from trainforge.driver.resource_wait import EVERY_S, FIRST_S, Watch, describe, pending_needs, placed

JOB = "02000000"


def group(state: str, job: str, *bundles: dict[str, float], number: int = 1) -> tuple[str, dict]:
    """A placement group table's entry: its ID is 14 bytes of its own, then its job's 4."""
    group_id = f"{0x9F1C2A7B5E3D4C6A8B0E1F2D3C00 + number:028x}" + job
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


def test_a_restart_that_waits_is_said_as_one() -> None:
    """Pending at the start: said after FIRST_S and every EVERY_S; placed; then the restart's
    new group pending: said again, as a restart's, FIRST_S after it was first seen."""
    watch = Watch(JOB)
    first = dict([group("PENDING", JOB, {"CPU": 1.0}, {"CPU": 1.0})])
    assert watch.look({}, 0.0) is None  # Ray Train has not asked for a group yet
    assert watch.look(first, 1.0) is None
    assert watch.look(first, 1.0 + FIRST_S) == ({"CPU": 2.0}, FIRST_S)
    assert watch.look(first, 2.0 + FIRST_S) is None
    assert watch.look(first, 1.0 + FIRST_S + EVERY_S) == ({"CPU": 2.0}, FIRST_S + EVERY_S)
    assert watch.placements == 0
    assert watch.look(dict([group("CREATED", JOB, {"CPU": 1.0}, {"CPU": 1.0})]), 100.0) is None
    assert watch.placements == 1
    restart = dict([group("REMOVED", JOB, {"CPU": 1.0}, {"CPU": 1.0}),
                    group("PENDING", JOB, {"CPU": 1.0}, {"CPU": 1.0}, number=2)])  # fmt: skip
    assert watch.look(restart, 200.0) is None
    assert watch.look(restart, 200.0 + FIRST_S) == ({"CPU": 2.0}, FIRST_S)
    assert watch.placements == 1  # the line says "to restart"
    assert describe({"CPU": 2.0}, {}, {"CPU": 2.0}, 10.4, restart=True) == (
        "workers: waiting for resources to restart: the run needs 2 CPU; the cluster has 0 of 2 "
        "CPU free (10 s)"
    )


def test_a_group_placed_before_the_first_look_makes_a_later_pending_one_a_restart() -> None:
    watch = Watch(JOB)
    assert watch.look(dict([group("CREATED", JOB, {"CPU": 1.0})]), 0.0) is None
    assert watch.placements == 1
    restart = dict([group("PENDING", JOB, {"CPU": 1.0}, number=2)])
    assert watch.look(restart, 50.0) is None
    assert watch.look(restart, 50.0 + FIRST_S) == ({"CPU": 1.0}, FIRST_S)
    assert watch.placements == 1  # said as a restart's
    other = Watch(JOB)
    assert other.look(dict([group("CREATED", "03000000", {"CPU": 1.0})]), 0.0) is None
    assert other.placements == 0  # another job's group placed: not this run's


def test_a_group_placed_within_first_s_says_nothing() -> None:
    watch = Watch(JOB)
    pending = dict([group("PENDING", JOB, {"CPU": 1.0})])
    assert watch.look(pending, 0.0) is None
    assert watch.look(pending, FIRST_S - 0.1) is None
    assert watch.look(dict([group("CREATED", JOB, {"CPU": 1.0})]), FIRST_S + 1) is None
    assert watch.placements == 1
