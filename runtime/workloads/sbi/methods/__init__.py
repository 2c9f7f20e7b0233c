"""The methods of simulation-based inference a recipe may train (``workload.method``), by
sbi's names. A method is one module here (``npe.py``, ``nle.py``, ``nre.py``, ``fmpe.py``,
``npse.py``) that fills in ``base.Method``; adding one is adding its module and its entry below.
No torch is imported here: the driver checks a recipe's method with ``check``."""

from __future__ import annotations

from typing import Any

from trainforge.errors import RecipeError, not_one_of
from trainforge.workloads.sbi.methods import fmpe, nle, npe, npse, nre
from trainforge.workloads.sbi.methods.base import Method

METHODS: dict[str, Method] = {
    m.name: m for m in (npe.METHOD, nle.METHOD, nre.METHOD, nre.METHOD_C, fmpe.METHOD, npse.METHOD)
}
NAMES = tuple(METHODS)


def get(name: str) -> Method:
    return METHODS[name]


def model_of(cfg: Any) -> str:
    """The recipe's ``workload.estimator.model``, or its method's default where it names none."""
    return cfg.estimator.model or METHODS[cfg.method].default_model


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
    check_model(method, cfg.estimator.model)


def check_model(method: Method, model: str | None) -> None:
    """A builder name of another kind of estimator is refused: a classifier (nre's) learns no
    density, a flow outputs no ratio."""
    if model is None or ":" in model:  # the method's default, or the user's own builder
        return
    owners = [m.name for m in METHODS.values() if model in m.models]
    fits = model in method.models if method.models else not owners
    if fits:
        return
    named = " and ".join([", ".join(owners[:-1]), owners[-1]] if len(owners) > 1 else owners)
    kind = f"the estimator of {named}" if owners else "a density estimator (a flow)"
    takes = ", ".join(method.models) if method.models else "a density estimator (maf, nsf, …)"
    raise RecipeError(
        f"workload.estimator.model: {model} is {kind}, and method {method.name} learns "
        f"{method.learns}; use {takes} (default {method.default_model}), or your own builder "
        "by import path"
    )


__all__ = ["METHODS", "NAMES", "Method", "check", "check_model", "get", "model_of"]
