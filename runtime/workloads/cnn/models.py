"""Image classifiers for the CNN workload, chosen by the recipe key ``workload.model``."""

from __future__ import annotations

import torch
from torch import nn

from trainforge.errors import RecipeError

# The recipe checks (``checks.py``, which reads the whole recipe schema) are imported where a
# model is built, not with the classes: a logged model ships this module and what it imports
# at its top level (``tracking/model_code.py``), and loads with that alone.


class SimpleCNN(nn.Module):
    """The small LeNet-style net of PyTorch's CIFAR "Training a classifier" tutorial.

    Deliberately free of dropout and batch norm, so a sample's gradient does not depend on
    the rest of its batch; tests comparing data-parallel and single-process runs rely on it.
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10, image_size: int = 32) -> None:
        super().__init__()
        side = _simple_cnn_feature_side(image_size)
        self.features = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(16 * side * side, 120),
            nn.ReLU(),
            nn.Linear(120, 84),
            nn.ReLU(),
            nn.Linear(84, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


def _simple_cnn_feature_side(image_size: int) -> int:
    # Two rounds of (5x5 valid conv, 2x2 pool): 32 -> 28 -> 14 -> 10 -> 5.
    side = (image_size - 4) // 2
    side = (side - 4) // 2
    if side < 1:
        raise RecipeError(
            f"workload.image_size={image_size} is too small for simple_cnn "
            "(it needs at least 14 pixels a side; 32 is the usual choice)"
        )
    return side


class BasicBlock(nn.Module):
    """Two 3x3 convs with a residual connection (ResNet-18/34 building block)."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or in_planes != planes:
            # The identity no longer fits, so project with a 1x1 conv to the new shape.
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                nn.BatchNorm2d(planes),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + self.shortcut(x))


class ResNet18CIFAR(nn.Module):
    """ResNet-18 adapted to 32x32 inputs: 3x3 stride-1 stem and no max-pool.

    The ImageNet stem (7x7 stride 2 plus max-pool) would shrink a CIFAR image to 8x8 before
    the first residual stage and cost several points of accuracy.
    """

    stage_widths = (64, 128, 256, 512)
    blocks_per_stage = (2, 2, 2, 2)

    def __init__(self, in_channels: int = 3, num_classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, 64, 3, stride=1, padding=1, bias=False),
            nn.BatchNorm2d(64),
            nn.ReLU(inplace=True),
        )
        stages: list[nn.Module] = []
        in_planes = 64
        for index, (width, blocks) in enumerate(
            zip(self.stage_widths, self.blocks_per_stage, strict=True)
        ):
            first_stride = 1 if index == 0 else 2
            stages.append(_make_stage(in_planes, width, blocks, first_stride))
            in_planes = width
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(in_planes, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.pool(self.stages(self.stem(x)))
        return self.fc(torch.flatten(out, 1))


def _make_stage(in_planes: int, planes: int, blocks: int, stride: int) -> nn.Sequential:
    layers = [BasicBlock(in_planes, planes, stride)]
    layers += [BasicBlock(planes, planes, 1) for _ in range(blocks - 1)]
    return nn.Sequential(*layers)


def build_model(name: str, in_channels: int, num_classes: int, image_size: int) -> nn.Module:
    """Build the classifier named by ``workload.model``, freshly initialised."""
    from trainforge.workloads.cnn.checks import TORCHVISION_PREFIX, check_model_name

    check_model_name(name)
    if name == "simple_cnn":
        return SimpleCNN(in_channels=in_channels, num_classes=num_classes, image_size=image_size)
    if name == "resnet18_cifar":
        return ResNet18CIFAR(in_channels=in_channels, num_classes=num_classes)
    return _build_torchvision_model(
        name[len(TORCHVISION_PREFIX) :].strip(), in_channels, num_classes
    )


def _build_torchvision_model(tv_name: str, in_channels: int, num_classes: int) -> nn.Module:
    from trainforge.workloads.cnn.checks import (
        TORCHVISION_PREFIX,
        check_torchvision_name,
        import_torchvision,
    )

    torchvision = import_torchvision()
    check_torchvision_name(torchvision, tv_name)
    if in_channels != 3:
        # torchvision's stems are hard-wired to RGB; failing here beats a shape error
        # deep inside the first forward pass on every worker.
        raise RecipeError(
            f"workload.model='{TORCHVISION_PREFIX}{tv_name}' expects 3-channel (RGB) images, "
            f"but the data set has {in_channels}; use simple_cnn or resnet18_cifar instead"
        )
    return torchvision.models.get_model(tv_name, weights=None, num_classes=num_classes)
