from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

from trainforge.errors import RecipeError
from trainforge.workloads.cnn.checks import KNOWN_MODELS, check_model_name
from trainforge.workloads.cnn.models import (
    ResNet18CIFAR,
    SimpleCNN,
    build_model,
)


def _torchvision_importable() -> bool:
    if importlib.util.find_spec("torchvision") is None:
        return False
    try:
        import torchvision  # noqa: F401
    except Exception:
        return False
    return True


@pytest.mark.parametrize("in_channels", [3, 1])
def test_simple_cnn_output_shape(in_channels: int) -> None:
    model = SimpleCNN(in_channels=in_channels, num_classes=7, image_size=32)
    out = model(torch.randn(4, in_channels, 32, 32))
    assert out.shape == (4, 7)


def test_simple_cnn_follows_other_image_sizes() -> None:
    # 64 -> 60 -> 30 -> 26 -> 13, so the first Linear must take 16*13*13 features.
    model = SimpleCNN(in_channels=3, num_classes=10, image_size=64)
    assert model(torch.randn(2, 3, 64, 64)).shape == (2, 10)
    first_linear = next(m for m in model.modules() if isinstance(m, nn.Linear))
    assert first_linear.in_features == 16 * 13 * 13


def test_simple_cnn_is_tutorial_net_without_batch_dependent_layers() -> None:
    model = SimpleCNN()
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [
        (16 * 5 * 5, 120),
        (120, 84),
        (84, 10),
    ]
    forbidden = (nn.Dropout, nn.BatchNorm2d, nn.BatchNorm1d)
    assert not any(isinstance(m, forbidden) for m in model.modules())


def test_simple_cnn_too_small_image_is_recipe_error() -> None:
    with pytest.raises(RecipeError, match=r"workload\.image_size"):
        SimpleCNN(image_size=8)


def test_resnet18_cifar_output_shape() -> None:
    model = ResNet18CIFAR(in_channels=3, num_classes=10).eval()
    with torch.no_grad():
        out = model(torch.randn(4, 3, 32, 32))
    assert out.shape == (4, 10)


def test_resnet18_cifar_param_count_and_no_maxpool() -> None:
    model = ResNet18CIFAR(num_classes=10)
    params = sum(p.numel() for p in model.parameters())
    assert abs(params - 11.17e6) / 11.17e6 < 0.01, params
    assert not any(isinstance(m, nn.MaxPool2d) for m in model.modules())


def test_resnet18_cifar_stem_is_3x3_stride_1() -> None:
    model = ResNet18CIFAR()
    stem_conv = next(m for m in model.modules() if isinstance(m, nn.Conv2d))
    assert stem_conv.kernel_size == (3, 3)
    assert stem_conv.stride == (1, 1)


@pytest.mark.parametrize(
    ("name", "expected_type"),
    [("simple_cnn", SimpleCNN), ("resnet18_cifar", ResNet18CIFAR)],
)
def test_build_model_known_names(name: str, expected_type: type[nn.Module]) -> None:
    model = build_model(name, in_channels=1, num_classes=5, image_size=32)
    assert isinstance(model, expected_type)
    assert model.eval()(torch.randn(2, 1, 32, 32)).shape == (2, 5)


def test_build_model_unknown_name_suggests_close_match() -> None:
    with pytest.raises(RecipeError) as info:
        build_model("simple_cn", in_channels=3, num_classes=10, image_size=32)
    message = str(info.value)
    assert "workload.model" in message
    assert "did you mean 'simple_cnn'" in message


def test_unknown_far_name_lists_choices_without_suggestion() -> None:
    with pytest.raises(RecipeError) as info:
        check_model_name("transformer")
    message = str(info.value)
    assert "workload.model" in message
    assert all(name in message for name in KNOWN_MODELS)
    assert "torchvision:<name>" in message
    assert "did you mean" not in message


def test_check_model_name_accepts_valid_names_without_torchvision() -> None:
    for name in (*KNOWN_MODELS, "torchvision:resnet50", "torchvision:no_such_model"):
        check_model_name(name)


@pytest.mark.parametrize("name", ["torchvision:", "torchvision:  "])
def test_check_model_name_rejects_empty_torchvision_name(name: str) -> None:
    with pytest.raises(RecipeError, match=r"workload\.model"):
        check_model_name(name)


def test_build_torchvision_model() -> None:
    if _torchvision_importable():
        model = build_model("torchvision:resnet18", in_channels=3, num_classes=7, image_size=32)
        assert model.eval()(torch.randn(2, 3, 32, 32)).shape == (2, 7)
    else:
        with pytest.raises(RecipeError) as info:
            build_model("torchvision:resnet18", in_channels=3, num_classes=7, image_size=32)
        message = str(info.value)
        assert "workload.model" in message
        assert "pip install 'trainforge[vision]'" in message


def test_build_unknown_torchvision_model_is_recipe_error() -> None:
    # Without torchvision this is the "install it" error; with it, the "no such model" one.
    with pytest.raises(RecipeError, match=r"workload\.model") as info:
        build_model("torchvision:no_such_model", in_channels=3, num_classes=7, image_size=32)
    if _torchvision_importable():
        assert "no classification model 'no_such_model'" in str(info.value)
        assert "resnet18" in str(info.value) or "alexnet" in str(info.value)
