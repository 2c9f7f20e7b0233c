"""CNN image classification (``workload.kind: cnn``): its spec for the workload registry. The
checks come from ``checks.py`` (no torch: the driver checks a CNN recipe without it); the
workload itself is built in the workers (``workload.py``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from trainforge.config.schema import PrecisionSection
from trainforge.workloads import user_code
from trainforge.workloads.cnn.checks import check, check_machine, is_users_model, train_samples
from trainforge.workloads.cnn.config import CNNWorkloadConfig
from trainforge.workloads.spec import WorkloadSpec
from trainforge.workloads.stage import StageRunner

if TYPE_CHECKING:
    from trainforge.workloads.cnn.workload import CNNWorkload


def build(cfg: CNNWorkloadConfig, seed: int, precision: PrecisionSection) -> CNNWorkload:
    from trainforge.workloads.cnn import workload  # torch, the models and data sets

    return workload.build(cfg, seed, precision)


def check_data(cfg: CNNWorkloadConfig) -> None:
    """The data set and torchvision where the recipe needs them; the user's own model built
    and run on a batch here (``users_model.probe``)."""
    check_machine(cfg)
    if is_users_model(cfg.model):
        from trainforge.workloads.cnn import users_model  # torch, the user's code

        users_model.probe(cfg)


def locate_code(
    cfg: CNNWorkloadConfig, seed: int, storage_root: str, runner: StageRunner | None
) -> CNNWorkloadConfig:
    """The section with ``code_dir`` where ``workload.model`` is the user's own (its module,
    imported by the driver's check, was found there); unchanged otherwise."""
    return user_code.with_code_dir(cfg, cfg.model if is_users_model(cfg.model) else None)


SPEC = WorkloadSpec(
    kind="cnn",
    schema=CNNWorkloadConfig,
    build=build,
    check=check,
    check_data=check_data,
    train_samples=train_samples,
    prepare_data=locate_code,
)

__all__ = ["SPEC"]
