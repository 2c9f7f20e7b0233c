"""What the training loop needs from a workload: a built-in family's (CNN, SBI) or a user's own
(``trainforge.Workload``, named by ``workload.entry``: the same class). How a family declares
itself to the registry is ``spec.py``.

The loop owns distribution, precision, accumulation, checkpointing and reporting; a workload
owns only its model, its data and how to score a batch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainforge.data.types import Batch, Split
from trainforge.tracking.datasets import TrainingData

# (model, run_dir, folder) -> (metrics, files): see Workload.finish
Finish = Callable[[nn.Module, str | None, Path], tuple[dict[str, float], list[Path]]]


class Workload(ABC):
    """One workload instance in one worker. The optional hooks have defaults here, so the
    loop calls them without probing."""

    eval_batch_size: int | None = None
    """Validation batch size; None: the loop's default (the training batch, at least 256)."""
    loader_workers: int = 0
    """DataLoader worker processes for a streamed (Dataset) training split."""
    pin_memory: bool = False
    """Pinned host memory for a streamed training split's batches."""
    fills_cache: bool = True
    """Whether loading the data may write an on-disk cache (a download): rank 0 then loads
    first while the others wait. False lets every rank load at once."""
    model_name: str = "model"
    """The name of the final model in MLflow: what the recipe trains, e.g. ``resnet18_cifar``
    (MLflow refuses ``/ : . % " '`` in it)."""
    finish: Finish | None = None
    """Rank 0 after training: the workload's own evaluation and export, as ``finish(model,
    run_dir, folder) -> (metrics, files written under folder)``. None: the workload has no
    final stage. A hook that is there or not, rather than a method returning nothing: every
    rank must know without asking rank 0, because the loop reports (a barrier) once more
    after it."""

    def __init__(self, config: Any = None, seed: int = 0) -> None:
        """A user's workload (``workload.kind: python``) is made as ``Entry(config, seed=…)``:
        ``config`` is its recipe settings (its ``Config`` dataclass, or a dict), ``seed`` the
        run's. The built-in families make theirs with their own arguments."""
        self.config = config
        self.seed = seed

    @abstractmethod
    def build_model(self) -> nn.Module:
        """A fresh model (same initial weights on every rank, seeded by the loop)."""

    @abstractmethod
    def datasets(self, device: torch.device) -> tuple[Split, Split]:
        """(train, validation) splits, identical on every rank (the loop shards them)."""

    @abstractmethod
    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        """Mean loss of a prepared batch (under autocast when mixed precision is on). A batch
        is the split's tensors in the order ``datasets`` gave them; the workload names them."""

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        """Summable statistics of one prepared validation batch (summed over batches and
        ranks). Default: the batch's summed loss and its size, for ``val/loss``."""
        size = len(batch[0])
        loss = self.loss(model, batch).detach().float()
        return {"loss_sum": loss * size, "samples": torch.tensor(float(size), device=loss.device)}

    def summarize(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        """Validation metrics from the summed statistics, e.g. val/loss and val/accuracy.
        Default: ``val/loss``, the mean over the validation samples."""
        return {"val/loss": float(sums["loss_sum"] / sums["samples"].clamp(min=1))}

    def prepare_batch(self, batch: Batch, train: bool) -> Batch:
        """Per-batch work on the device before ``loss`` or ``eval_sums``: augmentation for
        training batches, memory format. Default: the batch as it is."""
        return batch

    def write_figures(self, sums: dict[str, torch.Tensor], folder: Path) -> list[Path]:
        """PNG files made from the final validation statistics (e.g. a confusion matrix)."""
        return []

    def mlflow_model(self, model: nn.Module, folder: Path) -> Callable[[], Any] | None:
        """How the final model goes to MLflow when not as ``mlflow.pytorch`` with the first
        input tensor as its example (None, the default): a function that logs it into the
        active MLflow run, using files it writes under ``folder`` now, as the logged model it
        is given (the keyword ``model_id``: MLflow's, named ``model_name``). Picklable, so that
        rank 0 can hand it to the command (``tracking/relay.py``; else rank 0 logs it)."""
        return None

    def training_data(self) -> TrainingData | None:
        """The training split as an MLflow dataset input (name, digest, size), called after
        ``datasets``. The digest comes from what determines the data, not from reading them.
        None, the default: no dataset input is logged."""
        return None

    def describe(self) -> dict[str, Any]:
        """Facts worth printing and logging once (data set sizes, parameter count…)."""
        return {}
