"""Optimizer and learning-rate schedule from the recipe's ``train`` section: by step (constant,
cosine, linear, after a linear warmup) or by validation (plateau: the LR falls each time val/loss
stops improving, for runs whose length early stopping decides)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def build_optimizer(
    model: nn.Module, train: Any, lr: float | None = None, capturable: bool = False
) -> torch.optim.Optimizer:
    """The recipe's optimizer at ``lr`` (default ``train.lr``; the loop passes the scaled LR).
    The fused implementations, on CUDA and on the CPU: one or two kernels per step instead of
    several per parameter tensor (on one CPU thread the step took a third to a half of the
    time: ``bench/optimizer_step_cpu.py``). ``capturable``: for CUDA graph capture, with the LR
    in a device tensor that the schedule updates in place (a float would be frozen into the
    graph). Adam and AdamW also keep their step counter on the device; SGD has none, and its
    fused kernel reads a tensor LR on the device, so fused SGD is capturable as it is
    (momentum buffers that the capture's warm-up created are zeroed afterwards, which is where
    a first step starts from with zero dampening: see ``worker.step``)."""
    params = [p for p in model.parameters() if p.requires_grad]
    rate: float | torch.Tensor = train.lr if lr is None else lr
    device = params[0].device.type if params else None
    # CUDA graphs (capturable) are CUDA's alone: on the CPU only a test asks for them
    fusable = device == "cuda" or (device == "cpu" and not capturable)
    fused: dict[str, Any] = {"fused": True} if fusable else {}
    if capturable:
        rate = torch.tensor(rate, device=params[0].device)
    if train.optimizer == "sgd":
        return SGD(
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
        return AdamW(params, lr=rate, weight_decay=train.weight_decay, **fused)
    if train.optimizer == "adam":
        return Adam(params, lr=rate, weight_decay=train.weight_decay, **fused)
    raise AssertionError(f"unvalidated optimizer {train.optimizer}")


# torch's methods without their decorators, looked up once (not at every step)
_ADD_PARAM_GROUP = inspect.unwrap(torch.optim.Optimizer.add_param_group)
_ZERO_GRAD = inspect.unwrap(torch.optim.Optimizer.zero_grad)
_STATE_DICT = inspect.unwrap(torch.optim.Optimizer.state_dict)
_LOAD_STATE_DICT = inspect.unwrap(torch.optim.Optimizer.load_state_dict)


class WithoutDynamo:
    """torch's own optimizer methods, called without their TorchDynamo decorators.

    Every torch optimizer imports ``torch._dynamo`` the first time it adds a parameter group or
    steps (``torch._disable_dynamo`` and ``_use_grad_for_differentiable``), only to tell
    ``torch.compile`` not to trace into it. That import is 0.9 s of this project's CPU and
    3.5-5.3 s of a cold GPU worker (``bench/worker_start_phases.py``: sympy alone is ~1.9 s),
    as long as torch's own import, and a one-worker run needs it nowhere else (DDP's
    constructor imports it too, so runs of several workers pay it whatever the optimizer).
    The loop never calls the optimizer from compiled code (``precision.compile`` compiles the
    model), so the decorators change nothing here. The methods are torch's (``inspect.unwrap``
    of the decorated ones): same kernels, same state and ``state_dict`` as the torch class,
    so checkpoints load either way."""

    # the torch optimizer class whose step this one runs, and that step undecorated (each
    # subclass sets both)
    torch_class: type[torch.optim.Optimizer]
    torch_step: Callable[..., Any]

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        _ADD_PARAM_GROUP(self, param_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        _ZERO_GRAD(self, set_to_none)

    def state_dict(self) -> dict[str, Any]:
        return _STATE_DICT(self)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        _LOAD_STATE_DICT(self, state_dict)

    def step(self, closure: Any = None) -> Any:  # torch's overloads: None, or a closure's float
        # what _use_grad_for_differentiable does besides the import: no autograd in the update
        with torch.no_grad():
            return type(self).torch_step(self, closure)


class SGD(WithoutDynamo, torch.optim.SGD):
    torch_class = torch.optim.SGD
    torch_step = staticmethod(inspect.unwrap(torch.optim.SGD.step))


class Adam(WithoutDynamo, torch.optim.Adam):
    torch_class = torch.optim.Adam
    torch_step = staticmethod(inspect.unwrap(torch.optim.Adam.step))


class AdamW(WithoutDynamo, torch.optim.AdamW):
    torch_class = torch.optim.AdamW
    torch_step = staticmethod(inspect.unwrap(torch.optim.AdamW.step))


def lr_factor(step: int, total_steps: int, train: Any) -> float:
    """Multiplier of the peak LR at optimizer step ``step`` (0-based); for ``plateau`` the
    warmup's part (``PlateauLR`` multiplies in its own)."""
    if train.warmup_steps and step < train.warmup_steps:
        return (step + 1) / train.warmup_steps
    if train.schedule in ("constant", "plateau"):
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
    if train.schedule == "plateau":
        return PlateauLR(optimizer, train)
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_factor(step, total_steps, train)
    )


class PlateauLR(torch.optim.lr_scheduler.LambdaLR):
    """The LR times ``train.plateau_factor`` each time ``train.plateau_patience`` evaluations in
    a row have not improved on the best val/loss, down to ``min_lr_ratio`` × lr (after the
    warmup). A run of unknown length — early stopping decides it — cannot decay by step; a
    constant LR keeps its validation loss noisy to the end (the 10^6 SBI recipes stopped at
    epochs 25-30 with the loss still jumping between evaluations). Its counters are attributes,
    so they are in ``state_dict`` and a resumed run goes on where it stopped."""

    def __init__(self, optimizer: torch.optim.Optimizer, train: Any) -> None:
        self.scale, self.best, self.since_best = 1.0, math.inf, 0
        self.patience, self.factor = train.plateau_patience, train.plateau_factor
        self.floor = train.min_lr_ratio
        super().__init__(optimizer, lambda step: lr_factor(step, 0, train) * self.scale)

    def evaluated(self, val_loss: float) -> bool:
        """Record one evaluation (the same all-reduced value on every rank, so every rank
        decides alike); True when it lowered the LR, which applies from the next step on."""
        if val_loss < self.best:
            self.best, self.since_best = val_loss, 0
            return False
        self.since_best += 1
        if self.since_best < self.patience or self.scale <= self.floor:
            return False
        self.scale, self.since_best = max(self.floor, self.scale * self.factor), 0
        apply_schedule(self)
        return True


def apply_schedule(scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
    """Set each group's LR to what the schedule gives at its current step, now (not at the
    next ``step()``)."""
    rates = [base * factor(scheduler.last_epoch) for base, factor in
             zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)]  # fmt: skip
    for group, lr in zip(scheduler.optimizer.param_groups, rates, strict=True):
        if isinstance(group["lr"], torch.Tensor):  # capturable: the graph reads this tensor
            group["lr"].fill_(lr)
        else:
            group["lr"] = lr
    scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]


def load_keeping_hyperparameters(
    scheduler: torch.optim.lr_scheduler.LambdaLR,
    optimizer_state: dict[str, Any],
    scheduler_state: dict[str, Any],
) -> None:
    """Load a checkpoint's optimizer and schedule states, keeping this run's hyperparameters:
    those states bring their own LR, weight decay and betas with them, and a resume whose
    recipe changes one (``checkpoint.allow_changes``) would train on with the old value while
    its records said the new. Unchanged, every value comes out as the checkpoint left it."""
    optimizer = scheduler.optimizer
    fresh = [{k: v for k, v in group.items() if k not in ("params", "lr")}
             for group in optimizer.param_groups]  # fmt: skip
    base_lrs = list(scheduler.base_lrs)
    optimizer.load_state_dict(optimizer_state)
    scheduler.load_state_dict(scheduler_state)
    for group, own in zip(optimizer.param_groups, fresh, strict=True):
        group.update(own)
    scheduler.base_lrs = base_lrs
    apply_schedule(scheduler)
