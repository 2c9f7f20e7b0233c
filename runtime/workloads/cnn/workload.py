"""CNN image classification: model, data placement, loss and top-1 accuracy."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainforge.data.types import Split, TensorData
from trainforge.errors import RecipeError, did_you_mean
from trainforge.plots import confusion_matrix
from trainforge.workloads.cnn.datasets import (
    KNOWN_DATASETS,
    TensorSplit,
    augment_batch,
    load_data,
)
from trainforge.workloads.cnn.models import build_model, check_model_name

# Keep a data set on the GPU only when it leaves most of the memory to training.
DEVICE_MEMORY_FRACTION = 0.4


def check(cfg: Any) -> None:
    if cfg.data_on_device not in ("auto", "true", "false"):
        raise RecipeError(
            f"workload.data_on_device: {cfg.data_on_device!r} is not one of auto, true, false"
        )
    if cfg.num_classes < 2:
        raise RecipeError(f"workload.num_classes: must be >= 2, got {cfg.num_classes}")
    if not 0 < cfg.val_fraction < 1:
        raise RecipeError(f"workload.val_fraction: must be in (0, 1), got {cfg.val_fraction}")
    if cfg.loader_workers < 0:
        raise RecipeError(f"workload.loader_workers: must be >= 0, got {cfg.loader_workers}")
    check_model_name(cfg.model)
    if cfg.dataset not in KNOWN_DATASETS:
        hint = did_you_mean(cfg.dataset, KNOWN_DATASETS)
        raise RecipeError(
            f"workload.dataset: {cfg.dataset!r} is not a known data set{hint}; "
            f"choose one of: {', '.join(KNOWN_DATASETS)}"
        )


class CNNWorkload:
    def __init__(self, cfg: Any, seed: int, channels_last: bool = False) -> None:
        self.cfg = cfg
        self.seed = seed
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.info: dict[str, Any] = {}

    def datasets(self, device: torch.device) -> tuple[Split, Split]:
        on_device = self.cfg.data_on_device != "false"
        data = load_data(self.cfg, self.seed, device if on_device else None)
        self.in_channels, self.num_classes = data.in_channels, data.num_classes
        self.image_size = data.image_size
        train = self._place(data.train, device)
        val = self._place(data.val, device)
        self.info = {"train_samples": len(train), "val_samples": len(val)}
        return train, val

    def _place(self, split: Any, device: torch.device) -> Split:
        if not isinstance(split, TensorSplit):
            return split  # a Dataset: streamed through a DataLoader
        data = TensorData(split.images, split.labels)
        if self.cfg.data_on_device == "false" or device.type != "cuda":
            return data
        nbytes = data.inputs.nbytes + data.targets.nbytes
        free, _ = torch.cuda.mem_get_info(device)
        if self.cfg.data_on_device == "true" or nbytes < DEVICE_MEMORY_FRACTION * free:
            return TensorData(data.inputs.to(device), data.targets.to(device))
        return data

    def build_model(self) -> nn.Module:
        model = build_model(self.cfg.model, self.in_channels, self.num_classes, self.image_size)
        self.info["parameters"] = sum(p.numel() for p in model.parameters())
        return model

    def prepare_batch(self, inputs: torch.Tensor, train: bool) -> torch.Tensor:
        if train and self.cfg.augment:
            inputs = augment_batch(inputs)
        return inputs.contiguous(memory_format=self.memory_format)

    def loss(self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(model(inputs), targets, label_smoothing=self.cfg.label_smoothing)

    def eval_sums(
        self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        logits = model(inputs).float()
        predicted = logits.argmax(dim=1)
        classes = logits.shape[1]
        confusion = torch.bincount(targets * classes + predicted, minlength=classes * classes)
        return {
            "loss_sum": F.cross_entropy(logits, targets, reduction="sum"),
            "correct": (predicted == targets).sum(),
            "count": torch.tensor(len(targets), device=targets.device),
            "confusion": confusion.reshape(classes, classes),
        }

    def summarize(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        count = max(sums["count"].item(), 1.0)
        return {
            "val/loss": sums["loss_sum"].item() / count,
            "val/accuracy": sums["correct"].item() / count,
        }

    def write_figures(self, sums: dict[str, torch.Tensor], folder: Path) -> list[Path]:
        if "confusion" not in sums:
            return []
        path = folder / "confusion_matrix.png"
        confusion_matrix(sums["confusion"].numpy(), path)
        return [path]

    def describe(self) -> dict[str, Any]:
        return {"model": self.cfg.model, "dataset": self.cfg.dataset, **self.info}
