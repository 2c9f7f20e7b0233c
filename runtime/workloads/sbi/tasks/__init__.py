"""The sbibm benchmark tasks (Lueckmann et al. 2021) by name: ``get_task("two_moons")``."""

from __future__ import annotations

import difflib
from collections.abc import Callable

from runtime.errors import RecipeError
from runtime.workloads.sbi.tasks.base import NUM_OBSERVATIONS, Task
from runtime.workloads.sbi.tasks.bernoulli_glm import BernoulliGLM
from runtime.workloads.sbi.tasks.gaussian import GaussianLinear, GaussianMixture
from runtime.workloads.sbi.tasks.slcp import SLCP
from runtime.workloads.sbi.tasks.two_moons import TwoMoons

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
        close = difflib.get_close_matches(name, TASKS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise UnknownTaskError(
            f"unknown SBI task {name!r}{hint}; known tasks: {', '.join(sorted(TASKS))}"
        )
    return TASKS[name]()
