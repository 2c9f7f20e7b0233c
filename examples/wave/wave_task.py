"""A workload of your own for trainforge: a small MLP learning a noisy wave, y = sin(x·w) + ε,
from generated data. trainforge gives it the same runtime as its built-in workloads: DDP
workers, sharding, mixed precision, checkpoints with exact resume, MLflow.

    trainforge train recipe.yaml        (run from this folder)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

import trainforge


@dataclass
class WaveConfig:
    """The recipe's ``workload.config``: every key is checked against these fields."""

    features: int = 8
    hidden: int = 64
    train_size: int = 4096
    val_size: int = 1024
    noise: float = 0.05


class WaveRegression(trainforge.Workload):
    Config = WaveConfig  # `self.config` is an instance of it, made from the recipe

    def build_model(self) -> nn.Module:
        c = self.config
        return nn.Sequential(
            nn.Linear(c.features, c.hidden), nn.GELU(),
            nn.Linear(c.hidden, c.hidden), nn.GELU(),
            nn.Linear(c.hidden, 1),
        )  # fmt: skip

    def datasets(self, device: torch.device) -> tuple:
        # the same data on every worker (trainforge shards them): generated from the run's seed
        c = self.config
        generator = torch.Generator().manual_seed(self.seed)
        weights = torch.randn(c.features, generator=generator) / c.features**0.5

        def split(rows: int) -> tuple[torch.Tensor, torch.Tensor]:
            x = torch.randn(rows, c.features, generator=generator)
            noise = c.noise * torch.randn(rows, 1, generator=generator)
            return x, torch.sin(x @ weights).unsqueeze(1) + noise

        return split(c.train_size), split(c.val_size)

    def loss(self, model: nn.Module, batch: trainforge.Batch) -> torch.Tensor:
        x, y = batch
        return nn.functional.mse_loss(model(x), y)

    def eval_sums(self, model: nn.Module, batch: trainforge.Batch) -> dict[str, torch.Tensor]:
        # sums, not means: trainforge adds them over batches and workers
        x, y = batch
        squared = (model(x).float() - y).pow(2).sum()
        return {"squared_error": squared, "rows": torch.tensor(float(len(x)), device=x.device)}

    def summarize(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        mse = float(sums["squared_error"] / sums["rows"])
        return {"val/loss": mse, "val/rmse": mse**0.5}
