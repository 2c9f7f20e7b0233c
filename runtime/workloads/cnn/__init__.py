"""CNN image classification (``workload.kind: cnn``): its spec for the workload registry. The
checks come from ``checks.py`` (no torch: the driver checks a CNN recipe without it); the
workload itself is built in the workers (``workload.py``)."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from trainforge.config.schema import PrecisionSection
from trainforge.workloads import user_code
from trainforge.workloads.cnn.checks import (
    check,
    check_machine,
    image_channels,
    is_users_dataset,
    is_users_model,
    train_samples,
)
from trainforge.workloads.cnn.config import CNNWorkloadConfig
from trainforge.workloads.spec import WorkloadSpec
from trainforge.workloads.stage import StageRunner

if TYPE_CHECKING:
    from trainforge.workloads.cnn.workload import CNNWorkload


def build(cfg: CNNWorkloadConfig, seed: int, precision: PrecisionSection) -> CNNWorkload:
    from trainforge.workloads.cnn import workload  # torch, the models and data sets

    return workload.build(cfg, seed, precision)


def check_data(cfg: CNNWorkloadConfig) -> None:
    """The data set and torchvision where the recipe needs them; the user's own data set made
    and checked here (``users_data.probe``), the user's own model built and run on a batch of
    its shape (``users_model.probe``)."""
    check_machine(cfg)
    channels = _users_channels(cfg) or image_channels(cfg)
    if is_users_model(cfg.model):
        from trainforge.workloads.cnn import users_model  # torch, the user's code

        users_model.probe(cfg, channels)


def with_found_code(
    cfg: CNNWorkloadConfig, seed: int, storage_root: str, runner: StageRunner | None
) -> CNNWorkloadConfig:
    """The section with what the driver's check found of the user's own code: the folder of
    its module (``code_dir``, the model's where both are the user's) and its data set's image
    channels; unchanged where the recipe names none."""
    own_model = cfg.model if is_users_model(cfg.model) else None
    own_data = cfg.dataset if is_users_dataset(cfg.dataset) else None
    cfg = user_code.with_code_dir(cfg, own_model or own_data)
    channels = _users_channels(cfg)
    return cfg if channels is None else dataclasses.replace(cfg, in_channels=channels)


def _users_channels(cfg: CNNWorkloadConfig) -> int | None:
    if not is_users_dataset(cfg.dataset):
        return None
    from trainforge.workloads.cnn import users_data  # torch, the user's code

    return users_data.probe(cfg)


SPEC = WorkloadSpec(
    kind="cnn",
    schema=CNNWorkloadConfig,
    build=build,
    check=check,
    check_data=check_data,
    train_samples=train_samples,
    prepare_data=with_found_code,
)

__all__ = ["SPEC"]
