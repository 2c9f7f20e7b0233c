"""A user's own workload (``workload.kind: python``): a ``trainforge.Workload`` subclass in the
user's project, named by import path, given the loop that the built-in families get."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainforge.config.schema import PrecisionSection
from trainforge.workloads import user_code
from trainforge.workloads.python.config import PythonWorkloadConfig
from trainforge.workloads.spec import WorkloadSpec
from trainforge.workloads.stage import StageRunner

if TYPE_CHECKING:
    from trainforge.workloads.base import Workload


def build(cfg: PythonWorkloadConfig, seed: int, precision: PrecisionSection) -> Workload:
    from trainforge.workloads.python.entry import make

    return make(cfg, seed)


def check_data(cfg: PythonWorkloadConfig) -> None:
    from trainforge.workloads.python import probe  # torch and the user's code

    probe.check(cfg)


def locate_code(
    cfg: PythonWorkloadConfig, seed: int, storage_root: str, runner: StageRunner | None
) -> PythonWorkloadConfig:
    """The section with ``code_dir``: where the entry's module was found."""
    return user_code.with_code_dir(cfg, cfg.entry)


SPEC = WorkloadSpec(
    kind="python",
    schema=PythonWorkloadConfig,
    build=build,
    check_data=check_data,
    prepare_data=locate_code,
)

__all__ = ["SPEC"]
