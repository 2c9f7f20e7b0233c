"""Optimizer and learning-rate schedule from the recipe's ``train`` section."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn


def build_optimizer(
    model: nn.Module, train: Any, lr: float | None = None, capturable: bool = False
) -> torch.optim.Optimizer:
    """The recipe's optimizer at ``lr`` (default ``train.lr``; the loop passes the scaled LR).
    On CUDA the fused implementations: one or two kernels per step instead of several per
    parameter tensor. ``capturable``: for CUDA graph capture, with the LR in a device tensor
    that the schedule updates in place (a float would be frozen into the graph). Adam and AdamW
    also keep their step counter on the device; SGD has none, and its fused kernel reads a
    tensor LR on the device, so fused SGD is capturable as it is (momentum buffers that the
    capture's warm-up created are zeroed afterwards, which is where a first step starts from
    with zero dampening: see ``worker.step``)."""
    params = [p for p in model.parameters() if p.requires_grad]
    rate: float | torch.Tensor = train.lr if lr is None else lr
    fused: dict[str, Any] = {"fused": True} if params and params[0].is_cuda else {}
    if capturable:
        rate = torch.tensor(rate, device=params[0].device)
    if train.optimizer == "sgd":
        return torch.optim.SGD(
            params,
            lr=rate,
            momentum=train.momentum,
            nesterov=train.momentum > 0,
            weight_decay=train.weight_decay,
            **fused,
        )
    if capturable:
        fused["capturable"] = True
    if train.optimizer == "adamw":
        return torch.optim.AdamW(params, lr=rate, weight_decay=train.weight_decay, **fused)
    if train.optimizer == "adam":
        return torch.optim.Adam(params, lr=rate, weight_decay=train.weight_decay, **fused)
    raise AssertionError(f"unvalidated optimizer {train.optimizer}")


def lr_factor(step: int, total_steps: int, train: Any) -> float:
    """Multiplier of the peak LR at optimizer step ``step`` (0-based)."""
    if train.warmup_steps and step < train.warmup_steps:
        return (step + 1) / train.warmup_steps
    if train.schedule == "constant":
        return 1.0
    decay_steps = max(1, total_steps - train.warmup_steps)
    progress = min(1.0, (step - train.warmup_steps) / decay_steps)
    floor = train.min_lr_ratio
    if train.schedule == "cosine":
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    return floor + (1 - floor) * (1 - progress)  # linear


def build_schedule(
    optimizer: torch.optim.Optimizer, train: Any, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, train)
    )
