"""Workload registry: ``workload.kind`` → recipe schema and implementation."""

from __future__ import annotations

from typing import Any

from runtime.errors import RecipeError, did_you_mean
from runtime.workloads.base import Workload
from runtime.workloads.cnn.config import CNNWorkloadConfig

SCHEMAS: dict[str, type] = {"cnn": CNNWorkloadConfig}


def workload_schema(kind: str) -> type:
    if kind not in SCHEMAS:
        raise RecipeError(
            f"workload.kind: unknown workload {kind!r}{did_you_mean(kind, SCHEMAS)}; "
            f"choices: {', '.join(SCHEMAS)}"
        )
    return SCHEMAS[kind]


def check_workload(cfg: Any) -> None:
    """Checks of the workload section's values (names, ranges), part of recipe validation."""
    if cfg.kind == "cnn":
        from runtime.workloads.cnn.workload import check

        check(cfg)


def check_workload_data(cfg: Any) -> None:
    """Is the data where the recipe says? Checked by `train` before any worker starts (a
    recipe can be valid on a machine that does not hold its data)."""
    if cfg.kind == "cnn":
        from runtime.workloads.cnn.datasets import check_data

        check_data(cfg)


def build_workload(cfg: Any, seed: int, precision: Any) -> Workload:
    if cfg.kind == "cnn":
        from runtime.workloads.cnn.workload import CNNWorkload

        return CNNWorkload(cfg, seed=seed, channels_last=precision.channels_last)
    raise AssertionError(f"unregistered workload kind {cfg.kind}")
