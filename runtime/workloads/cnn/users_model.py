"""A CNN recipe's own model by import path (``workload.model: my_pkg.nets:MyNet``): an
``nn.Module`` class, or a function returning one, called with ``workload.model_kwargs`` and
whichever of ``in_channels``, ``num_classes`` and ``image_size`` it takes."""

from __future__ import annotations

import re

import torch
from torch import nn

from trainforge.errors import UserCodeError
from trainforge.log import first_line
from trainforge.workloads import user_code
from trainforge.workloads.cnn.config import CNNWorkloadConfig

SHAPE_ARGUMENTS = ("in_channels", "num_classes", "image_size")


class ModelCodeError(UserCodeError):
    """The user's model cannot be imported, raises, or does not classify a batch of images."""


def build(cfg: CNNWorkloadConfig, in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    entry = user_code.import_object(cfg.model, "workload.model", cfg.code_dir, ModelCodeError)
    if not callable(entry):
        raise ModelCodeError(f"workload.model: {cfg.model} is {type(entry).__name__}, not an "
                             "nn.Module class or a function returning a model")  # fmt: skip
    shape = {"in_channels": in_channels, "num_classes": num_classes, "image_size": image_size}
    arguments = {
        **{k: v for k, v in shape.items() if user_code.takes(entry, k)},
        **cfg.model_kwargs,
    }
    try:
        model = entry(**arguments)
    except Exception as exc:  # the user's constructor: theirs to see, in one line
        given = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
        raise ModelCodeError(f"workload.model: {cfg.model}({given}) raised "
                             f"{type(exc).__name__}: {first_line(exc)}") from exc  # fmt: skip
    if not isinstance(model, nn.Module):
        raise ModelCodeError(f"workload.model: {cfg.model} returned {type(model).__name__}, "
                             "not a torch.nn.Module")  # fmt: skip
    return model


def probe(cfg: CNNWorkloadConfig, channels: int) -> None:
    """The driver's check before any worker starts: the model built on this CPU classifies a
    batch of two blank images of the data set's shape into ``num_classes`` scores each."""
    model = build(cfg, channels, cfg.num_classes, cfg.image_size)
    images = torch.zeros(2, channels, cfg.image_size, cfg.image_size)
    try:
        with torch.no_grad():
            scores = model.eval()(images)
    except Exception as exc:
        raise ModelCodeError(
            f"workload.model: {cfg.model} on a batch of {tuple(images.shape)} images raised "
            f"{type(exc).__name__}: {first_line(exc)}"
        ) from exc
    shape = tuple(scores.shape) if torch.is_tensor(scores) else type(scores).__name__
    if shape != (2, cfg.num_classes):
        raise ModelCodeError(
            f"workload.model: {cfg.model} returned {shape} for a batch of "
            f"{tuple(images.shape)} images: expected (2, {cfg.num_classes}), a score per class"
        )


def name(path: str) -> str:
    """The logged model's name: the attribute's, ``MyNet`` → ``my_net``."""
    attribute = path.rpartition(":")[2].rpartition(".")[2]
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", attribute).lower()
