"""The built-in tasks as the driver needs them: names, dimensions and cache fingerprints, without
torch (the tasks themselves, in ``tasks/``, are torch code and are imported by the workers and
the simulation stage). A test holds each entry to its task class."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CUSTOM = "custom"
NUM_OBSERVATIONS = 10
"""Every built-in task has observations 1..10 (sbibm's numbering)."""


@dataclass(frozen=True)
class TaskShape:
    dim_theta: int
    dim_x: int
    cpu_seconds_per_million: float
    """Prior draws and simulation of 10^6 rows on one CPU core (this project's 2-core machine,
    one thread, 2026-11-27): how the simulation stage decides to simulate without the cluster."""
    revision: int = 1
    """Raised when a task's simulator changes its output (``tasks/base.py``)."""


TASK_SHAPES: dict[str, TaskShape] = {
    "two_moons": TaskShape(2, 2, 0.13),
    "gaussian_linear": TaskShape(10, 10, 0.36),
    "gaussian_mixture": TaskShape(2, 2, 0.06),
    "slcp": TaskShape(5, 8, 0.45),
    "bernoulli_glm": TaskShape(10, 10, 5.9, revision=2),
}
KNOWN_TASKS = (*TASK_SHAPES, CUSTOM)


@dataclass(frozen=True)
class SourceFacts:
    """What the driver needs of a simulation source (``sources.SimulationSource`` has these
    too): its name, dimensions, whether it is torch code that runs on a GPU, and what
    addresses its cache entry."""

    name: str
    dim_theta: int
    dim_x: int
    vectorized: bool
    fingerprint: dict[str, Any] = field(default_factory=dict)


def fingerprint(name: str, revision: int) -> dict[str, Any]:
    """What identifies a built-in task's output in the simulation cache's key (the revision
    only once one was raised, so the other tasks keep their cache entries)."""
    return {"task": name} | ({"revision": revision} if revision > 1 else {})


def builtin(name: str) -> SourceFacts:
    """A built-in task's facts (``name`` one of ``TASK_SHAPES``)."""
    shape = TASK_SHAPES[name]
    return SourceFacts(name, shape.dim_theta, shape.dim_x, True, fingerprint(name, shape.revision))
