"""A CNN recipe's own data set by import path (``workload.dataset: my_pkg.data:make``): a
function called with ``workload.dataset_kwargs`` and whichever of ``seed``, ``image_size`` and
``num_classes`` it takes, returning the training and the validation split. Each split is a
tuple ``(images, labels)`` of tensors (float N×C×H×W, integer N), kept whole and sliced by the
trainer like the built-in small data sets, or a map-style ``Dataset`` of ``(C×H×W float image,
int label)`` items, streamed through a DataLoader. Images come normalised as the model wants
them; they are square, ``workload.image_size`` on a side."""

from __future__ import annotations

import json
from typing import Any

import torch
from torch.utils.data import Dataset

from trainforge.errors import UserCodeError
from trainforge.log import first_line
from trainforge.workloads import user_code
from trainforge.workloads.cnn.config import CNNWorkloadConfig
from trainforge.workloads.cnn.datasets import CNNData, TensorSplit


class DataCodeError(UserCodeError):
    """The user's data set cannot be imported, raises, or is not two splits of labelled images."""


def load(cfg: CNNWorkloadConfig, seed: int) -> CNNData:
    """The user's splits, checked: images of one shape, ``image_size`` square, labels in
    ``[0, num_classes)`` (every label of a tensor split, the first item's of a Dataset)."""
    made = _call(cfg, seed)
    if not (isinstance(made, tuple | list) and len(made) == 2):
        raise DataCodeError(f"workload.dataset: {cfg.dataset} returned "
                            f"{_described(made)}: expected (train, val), two splits")  # fmt: skip
    train, val = _split(cfg, made[0], "training"), _split(cfg, made[1], "validation")
    channels = {which: _first_image(cfg, split, which).shape[0]
                for which, split in (("training", train), ("validation", val))}  # fmt: skip
    if channels["training"] != channels["validation"]:
        raise DataCodeError(
            f"workload.dataset: {cfg.dataset}'s training images have {channels['training']} "
            f"channels and its validation images {channels['validation']}"
        )
    return CNNData(train, val, channels["training"], cfg.num_classes, cfg.image_size)


def probe(cfg: CNNWorkloadConfig) -> int:
    """The driver's check before any worker starts: the data set made on this CPU and checked;
    the channels its images have (what builds the model without the data, e.g. in
    ``trainforge.load``). Made once per command for the same settings: the check and the
    run's preparation both ask."""
    key = json.dumps([cfg.dataset, cfg.dataset_kwargs, cfg.image_size, cfg.num_classes],
                     sort_keys=True, default=repr)  # fmt: skip
    if key not in _PROBED:
        _PROBED[key] = load(cfg, seed=0).in_channels
    return _PROBED[key]


_PROBED: dict[str, int] = {}


def _call(cfg: CNNWorkloadConfig, seed: int) -> Any:
    entry = user_code.import_object(cfg.dataset, "workload.dataset", cfg.code_dir, DataCodeError)
    if not callable(entry):
        raise DataCodeError(f"workload.dataset: {cfg.dataset} is {type(entry).__name__}, not "
                            "a function returning (train, val)")  # fmt: skip
    given = {"seed": seed, "image_size": cfg.image_size, "num_classes": cfg.num_classes}
    arguments = {
        **{k: v for k, v in given.items() if user_code.takes(entry, k)},
        **cfg.dataset_kwargs,
    }
    try:
        return entry(**arguments)
    except Exception as exc:  # the user's loader: theirs to see, in one line
        listed = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
        raise DataCodeError(f"workload.dataset: {cfg.dataset}({listed}) raised "
                            f"{type(exc).__name__}: {first_line(exc)}") from exc  # fmt: skip


def _split(cfg: CNNWorkloadConfig, value: Any, which: str) -> TensorSplit | Dataset:
    where = f"workload.dataset: {cfg.dataset}'s {which} split"
    if isinstance(value, Dataset):
        if len(value) == 0:  # type: ignore[arg-type]  # map-style: has a length
            raise DataCodeError(f"{where} is empty")
        return value
    if not (isinstance(value, tuple | list) and len(value) == 2
            and all(torch.is_tensor(t) for t in value)):  # fmt: skip
        raise DataCodeError(f"{where} is {_described(value)}: expected a tuple (images, labels) "
                            "of tensors or a map-style torch Dataset")  # fmt: skip
    images, labels = value
    if images.dim() != 4 or not images.is_floating_point():
        raise DataCodeError(f"{where}: images are {_described(images)}: expected float N×C×H×W")
    if labels.dim() != 1 or labels.is_floating_point() or len(labels) != len(images):
        raise DataCodeError(f"{where}: labels are {_described(labels)}: expected "
                            f"{len(images)} integer class indices, one per image")  # fmt: skip
    if len(labels) == 0:
        raise DataCodeError(f"{where} is empty")
    _check_labels(cfg, where, int(labels.min()), int(labels.max()))
    return TensorSplit(images.float(), labels.long())


def _first_image(cfg: CNNWorkloadConfig, split: TensorSplit | Dataset, which: str) -> Any:
    """The split's first image (a Dataset's first item checked as the loop will take it)."""
    where = f"workload.dataset: {cfg.dataset}'s {which} split"
    if isinstance(split, TensorSplit):
        image = split.images[0]
    else:
        item = split[0]
        if not (isinstance(item, tuple | list) and len(item) == 2 and torch.is_tensor(item[0])):
            raise DataCodeError(f"{where}: item 0 is {_described(item)}: expected "
                                "(image tensor C×H×W, int label)")  # fmt: skip
        image, label = item
        if image.dim() != 3 or not image.is_floating_point():
            raise DataCodeError(f"{where}: item 0's image is {_described(image)}: "
                                "expected float C×H×W")  # fmt: skip
        if not isinstance(label, int) and not (torch.is_tensor(label) and label.dim() == 0
                                               and not label.is_floating_point()):  # fmt: skip
            raise DataCodeError(f"{where}: item 0's label is {_described(label)}: "
                                "expected an int class index")  # fmt: skip
        _check_labels(cfg, where, int(label), int(label))
    side = cfg.image_size
    if tuple(image.shape[1:]) != (side, side):
        found = "×".join(str(n) for n in image.shape[1:])
        raise DataCodeError(f"{where}: images are {found}, and workload.image_size is {side}: "
                            "set workload.image_size to their side (square images)")  # fmt: skip
    return image


def _check_labels(cfg: CNNWorkloadConfig, where: str, low: int, high: int) -> None:
    if low < 0 or high >= cfg.num_classes:
        top = cfg.num_classes - 1
        raise DataCodeError(f"{where}: labels run {low}..{high}, and workload.num_classes is "
                            f"{cfg.num_classes}: labels must be 0..{top}")  # fmt: skip


def _described(value: Any) -> str:
    if torch.is_tensor(value):
        return f"a {value.dtype} tensor of shape {tuple(value.shape)}"
    if isinstance(value, tuple | list):
        parts = ", ".join(type(part).__name__ for part in value[:4])
        return f"a {type(value).__name__} ({parts}{', …' if len(value) > 4 else ''})"
    return type(value).__name__
