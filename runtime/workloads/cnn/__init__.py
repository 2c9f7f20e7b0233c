"""CNN image classification (``workload.kind: cnn``): its spec for the workload registry. The
checks come from ``checks.py`` (no torch: the driver checks a CNN recipe without it); the
workload itself is built in the workers (``workload.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainforge.config.schema import PrecisionSection
from trainforge.workloads.cnn.checks import check, check_machine, train_samples
from trainforge.workloads.cnn.config import CNNWorkloadConfig
from trainforge.workloads.spec import WorkloadSpec

if TYPE_CHECKING:
    from trainforge.workloads.cnn.workload import CNNWorkload


def build(cfg: CNNWorkloadConfig, seed: int, precision: PrecisionSection) -> CNNWorkload:
    from trainforge.workloads.cnn import workload  # torch, the models and data sets

    return workload.build(cfg, seed, precision)


SPEC = WorkloadSpec(
    kind="cnn",
    schema=CNNWorkloadConfig,
    build=build,
    check=check,
    check_data=check_machine,
    train_samples=train_samples,
)

__all__ = ["SPEC"]
