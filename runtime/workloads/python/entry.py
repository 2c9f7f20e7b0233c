"""The user's workload, made from the recipe: the entry imported by its path, handed its
settings (checked against its ``Config`` dataclass where it has one), called."""

from __future__ import annotations

import dataclasses
import inspect
import re
from typing import Any

from trainforge.config.load import typed_section
from trainforge.errors import RecipeError, UserCodeError
from trainforge.log import first_line
from trainforge.workloads import user_code
from trainforge.workloads.base import Workload
from trainforge.workloads.python.config import PythonWorkloadConfig


class WorkloadCodeError(UserCodeError):
    """The user's workload cannot be imported, raises, or breaks the Workload contract."""


def settings(entry: Any, cfg: PythonWorkloadConfig) -> Any:
    """What the entry is given: an instance of its ``Config`` dataclass made from
    ``workload.config`` (every key checked as a recipe's are), or the mapping itself."""
    schema = getattr(entry, "Config", None)
    if not (isinstance(schema, type) and dataclasses.is_dataclass(schema)):
        return dict(cfg.config)
    try:
        return typed_section(schema, cfg.config, "workload.config")
    except RecipeError as exc:  # wrong wherever it runs: `validate` fails on it too
        raise WorkloadCodeError(str(exc)) from None


def make(cfg: PythonWorkloadConfig, seed: int) -> Workload:
    """The user's Workload: ``entry(config)``, with ``seed=`` where the entry takes one."""
    entry = user_code.import_object(cfg.entry, "workload.entry", cfg.code_dir, WorkloadCodeError)
    if not callable(entry):
        raise WorkloadCodeError(
            f"workload.entry: {cfg.entry} is {type(entry).__name__}, not a trainforge.Workload "
            "subclass or a function returning one"
        )
    config = settings(entry, cfg)
    extra = {"seed": seed} if _takes_seed(entry) else {}
    try:
        workload = entry(config, **extra)
    except Exception as exc:  # the user's constructor: theirs to see, in one line
        raise WorkloadCodeError(
            f"workload.entry: {cfg.entry}(config) raised {type(exc).__name__}: {first_line(exc)}"
        ) from exc
    if not isinstance(workload, Workload):
        raise WorkloadCodeError(
            f"workload.entry: {cfg.entry}(config) returned {type(workload).__name__}, not a "
            "trainforge.Workload"
        )
    if workload.model_name == Workload.model_name:  # not named by the user's class
        workload.model_name = _snake_case(type(workload).__name__)
    return workload


def _snake_case(name: str) -> str:
    """``WaveRegression`` → ``wave_regression``: the logged model's name."""
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", name).lower()


def _takes_seed(entry: Any) -> bool:
    try:
        parameters = inspect.signature(entry).parameters
    except (TypeError, ValueError):  # a builtin or C callable: no signature to read
        return False
    return "seed" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )
