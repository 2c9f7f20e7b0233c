"""CNN image classification: model, data placement, loss and top-1 accuracy."""

from __future__ import annotations

from collections.abc import Sized
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainforge.config.schema import PrecisionSection
from trainforge.data.types import Batch, Split, TensorData, keep_on_device
from trainforge.tracking.datasets import TrainingData
from trainforge.workloads.base import Workload
from trainforge.workloads.cnn import users_data, users_model
from trainforge.workloads.cnn.checks import (
    TORCHVISION_PREFIX,
    image_channels,
    is_users_dataset,
    is_users_model,
)
from trainforge.workloads.cnn.config import CNNWorkloadConfig
from trainforge.workloads.cnn.datasets import (
    TensorSplit,
    augment_batch,
    load_data,
)
from trainforge.workloads.cnn.models import (
    build_model,
)


class CNNWorkload(Workload):
    def __init__(self, cfg: CNNWorkloadConfig, seed: int, channels_last: bool = False) -> None:
        self.cfg = cfg
        self.seed = seed
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.info: dict[str, Any] = {}
        # the images' shape as the recipe says it (``datasets`` sets it from the data): what
        # builds the model of a finished run without loading its data (``trainforge.load``)
        self.in_channels, self.num_classes = image_channels(cfg), cfg.num_classes
        self.image_size = cfg.image_size
        # Used only when the training split is a Dataset (imagefolder) streamed by a DataLoader.
        self.loader_workers = cfg.loader_workers
        self.pin_memory = cfg.pin_memory
        # only CIFAR-10 is fetched into a folder; digits, synthetic and ImageFolder only read
        self.fills_cache = cfg.dataset == "cifar10"
        # the logged model's name: the recipe's model (a torchvision model's own name)
        self.model_name = (users_model.name(cfg.model) if is_users_model(cfg.model)
                           else cfg.model.removeprefix(TORCHVISION_PREFIX).strip())  # fmt: skip

    def datasets(self, device: torch.device) -> tuple[Split, Split]:
        on_device = self.cfg.data_on_device != "false"
        if is_users_dataset(self.cfg.dataset):
            data = users_data.load(self.cfg, self.seed)
        else:
            data = load_data(self.cfg, self.seed, device if on_device else None)
        self.in_channels, self.num_classes = data.in_channels, data.num_classes
        self.image_size = data.image_size
        train = self._place(data.train, device)
        val = self._place(data.val, device)
        assert isinstance(train, Sized) and isinstance(val, Sized)  # tensors or image folders
        self.info = {"train_samples": len(train), "val_samples": len(val)}
        self.data_device = device.type if on_device else "cpu"  # where synthetic data are drawn
        return train, val

    def training_data(self) -> TrainingData:
        """Named after the data set; its digest from what makes it: the name, the split's
        sizes and image shape, the seed where it draws the split (digits) or the images
        (synthetic, whose generator also depends on the device type)."""
        cfg, rows, val_rows = self.cfg, self.info["train_samples"], self.info["val_samples"]
        shape = [self.in_channels, self.image_size, self.image_size]
        identity: dict[str, Any] = {
            "dataset": cfg.dataset, "rows": rows, "val_rows": val_rows, "shape": shape,
            "classes": self.num_classes,
        }  # fmt: skip
        if cfg.dataset in ("digits", "synthetic"):
            identity |= {"seed": self.seed, "val_fraction": cfg.val_fraction}
        if is_users_dataset(cfg.dataset):  # the user's function may draw from the seed
            identity |= {"seed": self.seed, "kwargs": cfg.dataset_kwargs}
        if cfg.dataset == "synthetic":
            identity["device"] = self.data_device
        on_disk = cfg.dataset in ("cifar10", "imagefolder") and cfg.data_root
        return TrainingData.of(
            cfg.dataset, identity, rows,
            source=str(cfg.data_root) if on_disk else f"trainforge:{cfg.dataset}",
            source_type="local" if on_disk else "code",
            profile={"val_rows": val_rows, "shape": shape, "classes": self.num_classes},
        )  # fmt: skip

    def _place(self, split: TensorSplit | Split, device: torch.device) -> Split:
        if not isinstance(split, TensorSplit):
            return split  # a Dataset: streamed through a DataLoader
        data = TensorData(split.images, split.labels)
        if keep_on_device(self.cfg.data_on_device, data.nbytes, device):
            # stored in the model's memory format: a gathered batch keeps it, so prepare_batch
            # need not copy it again every step
            images = split.images.to(device, memory_format=self.memory_format)
            return TensorData(images, split.labels.to(device))
        return data

    def build_model(self) -> nn.Module:
        shape = (self.in_channels, self.num_classes, self.image_size)
        if is_users_model(self.cfg.model):
            model = users_model.build(self.cfg, *shape)
        else:
            model = build_model(self.cfg.model, *shape)
        self.info["parameters"] = sum(p.numel() for p in model.parameters())
        return model

    def prepare_batch(self, batch: Batch, train: bool) -> Batch:
        images, labels = batch  # augmentation and memory format: the images only
        if train and self.cfg.augment:
            images = augment_batch(images)
        return images.contiguous(memory_format=self.memory_format), labels

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        images, labels = batch
        return F.cross_entropy(model(images), labels, label_smoothing=self.cfg.label_smoothing)

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        images, labels = batch
        logits = model(images).float()
        predicted = logits.argmax(dim=1)
        classes = logits.shape[1]
        confusion = torch.bincount(labels * classes + predicted, minlength=classes * classes)
        return {
            "loss_sum": F.cross_entropy(logits, labels, reduction="sum"),
            "correct": (predicted == labels).sum(),
            "count": torch.tensor(len(labels), device=labels.device),
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
        from trainforge.plots import confusion_matrix

        path = folder / "confusion_matrix.svg"
        confusion_matrix(sums["confusion"].numpy(), path)
        return [path]

    def describe(self) -> dict[str, Any]:
        return {"model": self.cfg.model, "dataset": self.cfg.dataset, **self.info}


def build(cfg: CNNWorkloadConfig, seed: int, precision: PrecisionSection) -> CNNWorkload:
    return CNNWorkload(cfg, seed=seed, channels_last=precision.channels_last)
