"""Workload registry: ``workload.kind`` → recipe schema and implementation."""

from __future__ import annotations

from typing import Any

from trainforge.errors import RecipeError, did_you_mean
from trainforge.workloads.base import Workload
from trainforge.workloads.cnn.config import CNNWorkloadConfig
from trainforge.workloads.sbi.config import SBIWorkloadConfig

SCHEMAS: dict[str, type] = {"cnn": CNNWorkloadConfig, "sbi": SBIWorkloadConfig}


def workload_schema(kind: str) -> type:
    if kind not in SCHEMAS:
        raise RecipeError(
            f"workload.kind: unknown workload {kind!r}{did_you_mean(kind, SCHEMAS)}; "
            f"choices: {', '.join(SCHEMAS)}"
        )
    return SCHEMAS[kind]


def check_workload(cfg: Any, precision: Any) -> None:
    """Checks of the workload section's values (names, ranges), part of recipe validation."""
    if cfg.kind == "cnn":
        from trainforge.workloads.cnn.workload import check

        check(cfg)
    if cfg.kind == "sbi":
        from trainforge.workloads.sbi.workload import check as check_sbi

        check_sbi(cfg, precision)


def check_workload_data(cfg: Any) -> None:
    """Is the data where the recipe says? Checked by `train` before any worker starts (a
    recipe can be valid on a machine that does not hold its data)."""
    if cfg.kind == "cnn":
        from trainforge.workloads.cnn.datasets import check_data

        check_data(cfg)
    if cfg.kind == "sbi":
        from trainforge.workloads.sbi.workload import check_data as check_sbi_data

        check_sbi_data(cfg)


def prepare_workload_data(cfg: Any, seed: int, storage_root: str) -> None:
    """Make data that does not exist yet (the SBI simulation stage), on the connected Ray
    cluster, before training workers start. May fill in resolved paths in ``cfg``."""
    if cfg.kind == "sbi":
        from trainforge.workloads.sbi.workload import prepare_data

        prepare_data(cfg, seed, storage_root)


def build_workload(cfg: Any, seed: int, precision: Any) -> Workload:
    if cfg.kind == "cnn":
        from trainforge.workloads.cnn.workload import CNNWorkload

        return CNNWorkload(cfg, seed=seed, channels_last=precision.channels_last)
    if cfg.kind == "sbi":
        from trainforge.workloads.sbi.workload import SBIWorkload

        return SBIWorkload(cfg, seed=seed)
    raise AssertionError(f"unregistered workload kind {cfg.kind}")
