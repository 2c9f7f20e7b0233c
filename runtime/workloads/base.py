"""What the training loop needs from a workload family (CNN, SBI, …).

The loop owns distribution, precision, accumulation, checkpointing and reporting; a workload
owns only its model, its data and how to score a batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from trainforge.data.types import Split


class Workload(Protocol):
    def build_model(self) -> nn.Module:
        """A fresh model (same initial weights on every rank, seeded by the loop)."""
        ...

    def datasets(self, device: torch.device) -> tuple[Split, Split]:
        """(train, validation) splits, identical on every rank (the loop shards them)."""
        ...

    def prepare_batch(self, inputs: torch.Tensor, train: bool) -> torch.Tensor:
        """Per-batch work on the device: augmentation for training batches, memory format."""
        ...

    def loss(self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean loss of the batch (under autocast when mixed precision is on)."""
        ...

    def eval_sums(
        self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor
    ) -> dict[str, torch.Tensor]:
        """Summable statistics of one validation batch (summed over batches and ranks)."""
        ...

    def summarize(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        """Validation metrics from the summed statistics, e.g. val/loss and val/accuracy."""
        ...

    def write_figures(self, sums: dict[str, torch.Tensor], folder: Path) -> list[Path]:
        """PNG files made from the final validation statistics (e.g. a confusion matrix)."""
        ...

    def describe(self) -> dict[str, Any]:
        """Facts worth printing and logging once (data set sizes, parameter count…)."""
        ...
