"""A CNN recipe's own model by import path (``workload.model: my_pkg.nets:MyNet``,
``workload/cnn/users_model.py``): built with its ``model_kwargs`` and the data set's shape,
named after its class in MLflow, and checked on the command's CPU before any worker starts."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch

from trainforge import config
from trainforge.errors import RecipeError, UserCodeError
from trainforge.workloads import build_workload, check_workload_data

USER_MODULE = """
import torch
from torch import nn


class TinyNet(nn.Module):
    def __init__(self, in_channels, num_classes, width=8):
        super().__init__()
        self.width = width
        self.conv = nn.Conv2d(in_channels, width, 3, padding=1)
        self.head = nn.Linear(width, num_classes)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x)).mean(dim=(2, 3)))


def rgb_only(num_classes):
    return TinyNet(3, num_classes)


def five_classes():
    return TinyNet(1, 5)


def not_a_model(num_classes):
    return "a model"
"""


@pytest.fixture
def user_module(importable_module: Callable[[str, str], str]) -> str:
    return importable_module("user_nets", USER_MODULE)


def _recipe(model: str, **workload: object) -> config.Recipe:
    return config.from_container({
        "run": {"name": "mine"},
        "workload": {"kind": "cnn", "dataset": "digits", "model": model, **workload},
    })  # fmt: skip


def test_a_users_model_is_built_with_its_arguments_and_the_data_sets_shape(
    user_module: str,
) -> None:
    cfg = _recipe(f"{user_module}:TinyNet", model_kwargs={"width": 4})
    check_workload_data(cfg.workload)  # the driver's probe passes
    workload = build_workload(cfg.workload, seed=0, precision=cfg.precision)
    assert workload.model_name == "tiny_net"
    workload.datasets(torch.device("cpu"))
    model = workload.build_model()
    assert type(model).__name__ == "TinyNet" and model.width == 4
    assert model.conv.in_channels == 1 and model.head.out_features == 10  # digits: grey, 10


@pytest.mark.parametrize(
    ("model", "kwargs", "message"),
    [
        ("rgb_only", {}, ":rgb_only on a batch of (2, 1, 32, 32) images raised RuntimeError: "),
        (
            "five_classes",
            {},
            ":five_classes returned (2, 5) for a batch of (2, 1, 32, 32) "
            "images: expected (2, 10), a score per class",
        ),
        (
            "TinyNet",
            {"depth": 3},
            ":TinyNet(in_channels=1, num_classes=10, depth=3) raised TypeError: ",
        ),
        ("not_a_model", {}, ":not_a_model returned str, not a torch.nn.Module"),
        ("Missing", {}, "has no 'Missing'"),
    ],
)
def test_a_broken_model_is_one_line_naming_it(
    user_module: str, model: str, kwargs: dict[str, object], message: str
) -> None:
    cfg = _recipe(f"{user_module}:{model}", model_kwargs=kwargs)
    with pytest.raises(UserCodeError, match=re.escape(message)) as caught:
        check_workload_data(cfg.workload)
    assert str(caught.value).startswith("workload.model: ") and "\n" not in str(caught.value)


def test_model_kwargs_are_only_for_a_users_model() -> None:
    with pytest.raises(RecipeError, match=r"workload\.model_kwargs: arguments for your own model"):
        _recipe("simple_cnn", model_kwargs={"width": 4})
    with pytest.raises(RecipeError, match=r"is not a known model; choose one of: .*my_pkg"):
        _recipe("simple-cnn")
