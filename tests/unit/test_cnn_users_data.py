"""A CNN recipe's own data set by import path (``workload.dataset: my_pkg.data:make``,
``workload/cnn/users_data.py``): made with its ``dataset_kwargs`` and the arguments it takes,
kept as tensors or streamed as a Dataset, its image channels found by the driver, and every
broken contract one line before any worker starts."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from trainforge import config
from trainforge.data.types import TensorData
from trainforge.errors import RecipeError, UserCodeError
from trainforge.workloads import build_workload, check_workload_data, spec_for

USER_MODULE = """
import torch
from torch.utils.data import Dataset


def bars(seed, image_size, size=64, channels=2):
    return split(seed, image_size, size, channels), split(seed + 1, image_size, size, channels)


def split(seed, image_size, size=64, channels=2):
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (size,), generator=generator)
    images = torch.zeros(size, channels, image_size, image_size)
    images[labels == 0, :, image_size // 2, :] = 1.0  # a row
    images[labels == 1, :, :, image_size // 2] = 1.0  # a column
    return images, labels


class Bars(Dataset):
    def __init__(self, image_size):
        self.images, self.labels = split(0, image_size, size=16)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.images[index], int(self.labels[index])


def mixed(image_size):
    return split(1, image_size), Bars(image_size)


def grey_and_rgb(image_size):
    return split(1, image_size, channels=1), split(2, image_size, channels=3)


def flat_images(image_size):
    images, labels = split(0, image_size)
    return (images.flatten(1), labels), (images, labels)


def float_labels(image_size):
    images, labels = split(0, image_size)
    return (images, labels.float()), (images, labels)


def one_split(image_size):
    return split(0, image_size)[0]


def raises(image_size):
    raise OSError("no such file: /data/bars.npz\\nsecond line")


def empty(image_size):
    images, labels = split(0, image_size)
    return (images[:0], labels[:0]), (images, labels)


class Strings(Dataset):
    def __len__(self):
        return 3

    def __getitem__(self, index):
        return "an image", 0


def strings(image_size):
    return split(0, image_size), Strings()


def three_labels(image_size):
    images, labels = split(0, image_size)
    labels[0] = 2
    return (images, labels), (images, labels)


NOT_CALLABLE = 42
"""


@pytest.fixture
def user_module(importable_module: Callable[[str, str], str]) -> str:
    return importable_module("user_data", USER_MODULE)


def _recipe(dataset: str, **workload: object) -> config.Recipe:
    return config.from_container({
        "run": {"name": "mine"},
        "workload": {"kind": "cnn", "dataset": dataset, "num_classes": 2, "image_size": 16,
                     **workload},
    })  # fmt: skip


def _prepared(cfg: config.Recipe) -> object:
    """The section as the driver hands it to the workers: checked, with what it found."""
    check_workload_data(cfg.workload)
    prepare = spec_for("cnn").prepare_data
    assert prepare is not None
    return prepare(cfg.workload, 0, "runs", None)


def test_a_users_tensors_train_a_model_of_their_channels(user_module: str, tmp_path: Path) -> None:
    cfg = _recipe(f"{user_module}:bars", dataset_kwargs={"size": 40, "channels": 2})
    section = _prepared(cfg)
    assert section.in_channels == 2 and section.code_dir == str(tmp_path)
    workload = build_workload(section, seed=3, precision=cfg.precision)
    train, val = workload.datasets(torch.device("cpu"))
    assert isinstance(train, TensorData) and len(train) == 40 and len(val) == 40
    expected_labels = torch.randint(0, 2, (40,), generator=torch.Generator().manual_seed(3))
    assert torch.equal(train.tensors[1], expected_labels)  # made with the run's seed
    model = workload.build_model()
    assert model.features[0].in_channels == 2
    images, labels = train.tensors
    assert workload.loss(model, (images[:4], labels[:4])).dim() == 0
    identity = workload.training_data()
    assert identity.name == f"{user_module}:bars"


def test_a_model_is_built_without_the_data_from_the_channels_the_driver_found(
    user_module: str,
) -> None:
    """What ``trainforge.load`` does with a finished run's recipe: no data set is made."""
    section = _prepared(_recipe(f"{user_module}:bars", dataset_kwargs={"channels": 1}))
    sys.modules.pop(user_module)  # not imported again: the data set is not made
    model = build_workload(section, seed=0, precision=config.Recipe().precision).build_model()
    assert model.features[0].in_channels == 1
    assert user_module not in sys.modules


def test_a_dataset_split_is_streamed_as_it_is(user_module: str) -> None:
    cfg = _recipe(f"{user_module}:mixed")
    workload = build_workload(_prepared(cfg), seed=0, precision=cfg.precision)
    train, val = workload.datasets(torch.device("cpu"))
    assert isinstance(train, TensorData) and type(val).__name__ == "Bars"


@pytest.mark.parametrize(
    ("entry", "overrides", "message"),
    [
        ("nowhere_module:bars", {}, "workload.dataset: cannot import module 'nowhere_module'"),
        ("{m}:absent", {}, "workload.dataset: module '{m}' has no 'absent'"),
        ("{m}:NOT_CALLABLE", {}, "workload.dataset: {m}:NOT_CALLABLE is int, not a function "
         "returning (train, val)"),
        ("{m}:raises", {}, "workload.dataset: {m}:raises(image_size=16) raised OSError: no such "
         "file: /data/bars.npz"),
        ("{m}:bars", {"dataset_kwargs": {"colour": 1}}, "workload.dataset: {m}:bars(seed=0, "
         "image_size=16, colour=1) raised TypeError: "),
        ("{m}:one_split", {}, "workload.dataset: {m}:one_split returned a torch.float32 "
         "tensor of shape (64, 2, 16, 16): expected (train, val), two splits"),
        ("{m}:flat_images", {}, "workload.dataset: {m}:flat_images's training split: images are "
         "a torch.float32 tensor of shape (64, 512): expected float N×C×H×W"),
        ("{m}:float_labels", {}, "workload.dataset: {m}:float_labels's training split: labels "
         "are a torch.float32 tensor of shape (64,): expected 64 integer class indices"),
        ("{m}:empty", {}, "workload.dataset: {m}:empty's training split is empty"),
        ("{m}:three_labels", {}, "workload.dataset: {m}:three_labels's training split: labels "
         "run 0..2, and workload.num_classes is 2: labels must be 0..1"),
        ("{m}:grey_and_rgb", {}, "workload.dataset: {m}:grey_and_rgb's training images have 1 "
         "channels and its validation images 3"),
        ("{m}:strings", {}, "workload.dataset: {m}:strings's validation split: item 0 is a "
         "tuple (str, int): expected (image tensor C×H×W, int label)"),
        ("{m}:bars", {"dataset_kwargs": {"image_size": 10}},
         "workload.dataset: {m}:bars's training split: images are 10×10, and "
         "workload.image_size is 16: set workload.image_size to their side"),
    ],
)  # fmt: skip
def test_a_broken_data_set_is_one_line_before_any_worker_starts(
    user_module: str, entry: str, overrides: dict, message: str
) -> None:
    expected = message.format(m=user_module)
    try:
        cfg = _recipe(entry.format(m=user_module), **overrides)
        check_workload_data(cfg.workload)
    except (RecipeError, UserCodeError) as exc:
        said = str(exc)
    else:
        pytest.fail("the broken data set passed the check")
    assert expected in said and "\n" not in said, said


def test_a_data_set_outside_a_known_name_or_an_import_path_is_refused() -> None:
    with pytest.raises(RecipeError, match=r"not a known data set.*or your own by import path"):
        _recipe("mnist")
    with pytest.raises(RecipeError, match=r"workload.dataset_kwargs: arguments for your own"):
        _recipe("digits", dataset_kwargs={"size": 3})
