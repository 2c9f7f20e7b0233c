"""Workload registry: ``workload.kind`` → the family's ``WorkloadSpec`` (schema, checks, data
stage, builder). A family is imported only when a recipe names it, so a CNN recipe is checked
and trained without importing the SBI family or the ``sbi`` package, and checked without
importing torch."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from trainforge.config.schema import PrecisionSection, WorkloadSection
from trainforge.errors import RecipeError, did_you_mean
from trainforge.workloads.spec import WorkloadSpec
from trainforge.workloads.stage import StageRunner

if TYPE_CHECKING:
    from trainforge.workloads.base import Workload

# kind → the package that exports its SPEC. A new family is one folder and one line here.
FAMILIES = {
    "cnn": "trainforge.workloads.cnn",
    "sbi": "trainforge.workloads.sbi",
    "python": "trainforge.workloads.python",  # the user's own, by import path
}


def spec_for(kind: str) -> WorkloadSpec[Any]:
    """The family's spec; RecipeError (with a did-you-mean) for an unknown kind."""
    if kind not in FAMILIES:
        raise RecipeError(
            f"workload.kind: unknown workload {kind!r}{did_you_mean(kind, FAMILIES)}; "
            f"choices: {', '.join(FAMILIES)}"
        )
    spec = importlib.import_module(FAMILIES[kind]).SPEC
    assert isinstance(spec, WorkloadSpec) and spec.kind == kind, FAMILIES[kind]
    return spec


def check_workload_data(cfg: WorkloadSection) -> None:
    """Is the data where the recipe says? Checked by `train` before any worker starts (a
    recipe can be valid on a machine that does not hold its data)."""
    spec_for(cfg.kind).check_data(cfg)


def train_samples(cfg: WorkloadSection) -> int | None:
    """Rows of the training split, when the recipe tells without loading data (else None)."""
    return spec_for(cfg.kind).train_samples(cfg)


def start_workload_data(
    cfg: WorkloadSection, seed: int, storage_root: str, runner: StageRunner
) -> None:
    """Begin what of the data stage needs no cluster, before the command reaches one."""
    start = spec_for(cfg.kind).start_data
    if start is not None:
        start(cfg, seed, storage_root, runner)


def resolve_workload(
    cfg: WorkloadSection, seed: int, storage_root: str, runner: StageRunner | None = None
) -> WorkloadSection:
    """The section with its data made and located (part of ``config.resolve``, on the
    connected Ray cluster, its work run by the driver's ``runner``); unchanged for a family
    without a data stage."""
    prepare = spec_for(cfg.kind).prepare_data
    return cfg if prepare is None else prepare(cfg, seed, storage_root, runner)


def build_workload(cfg: WorkloadSection, seed: int, precision: PrecisionSection) -> Workload:
    return spec_for(cfg.kind).build(cfg, seed, precision)
