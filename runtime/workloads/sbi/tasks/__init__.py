"""The sbibm benchmark tasks (Lueckmann et al. 2021) by name: ``get_task("two_moons")``."""

from __future__ import annotations

from collections.abc import Callable

from trainforge.errors import RecipeError, did_you_mean
from trainforge.workloads.sbi.tasks.base import NUM_OBSERVATIONS, Task
from trainforge.workloads.sbi.tasks.bernoulli_glm import BernoulliGLM
from trainforge.workloads.sbi.tasks.gaussian import GaussianLinear, GaussianMixture
from trainforge.workloads.sbi.tasks.slcp import SLCP
from trainforge.workloads.sbi.tasks.two_moons import TwoMoons

__all__ = [
    "NUM_OBSERVATIONS",
    "SLCP",
    "TASKS",
    "BernoulliGLM",
    "GaussianLinear",
    "GaussianMixture",
    "Task",
    "TwoMoons",
    "UnknownTaskError",
    "get_task",
]

TASKS: dict[str, Callable[[], Task]] = {
    "two_moons": TwoMoons,
    "gaussian_linear": GaussianLinear,
    "gaussian_mixture": GaussianMixture,
    "slcp": SLCP,
    "bernoulli_glm": BernoulliGLM,
}


class UnknownTaskError(RecipeError, ValueError):
    """A task name that is not registered (a recipe mistake, hence a RecipeError)."""


def get_task(name: str) -> Task:
    """A fresh instance of the task called ``name``."""
    if name not in TASKS:
        raise UnknownTaskError(
            f"unknown SBI task {name!r}{did_you_mean(name, TASKS)}; "
            f"known tasks: {', '.join(sorted(TASKS))}"
        )
    return TASKS[name]()
