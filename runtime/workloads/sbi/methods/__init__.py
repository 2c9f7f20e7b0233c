"""The methods of simulation-based inference a recipe may train (``workload.method``), by
sbi's names. A method is one module here (``npe.py``, ``nle.py``) that fills in ``base.Method``;
adding one is adding its module and its entry below. No torch is imported here: the driver
checks a recipe's method with ``check``."""

from __future__ import annotations

from typing import Any

from trainforge.errors import RecipeError, not_one_of
from trainforge.workloads.sbi.methods import nle, npe
from trainforge.workloads.sbi.methods.base import Method

METHODS: dict[str, Method] = {m.name: m for m in (npe.METHOD, nle.METHOD)}
NAMES = tuple(METHODS)


def get(name: str) -> Method:
    return METHODS[name]


def check(cfg: Any) -> None:
    """The recipe's ``workload.method`` and what it rules out of the estimator's keys."""
    if cfg.method not in METHODS:
        raise not_one_of("workload.method", cfg.method, NAMES)
    method = METHODS[cfg.method]
    if not method.embeds_x and cfg.estimator.embedding != "none":
        raise RecipeError(
            f"workload.estimator.embedding: method {method.name} learns {method.learns}, whose "
            f"x takes no embedding net; remove it ({cfg.estimator.embedding}) or use method npe"
        )


__all__ = ["METHODS", "NAMES", "Method", "check", "get"]
