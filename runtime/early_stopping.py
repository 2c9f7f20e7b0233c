"""Early stopping on val/loss and the best weights seen, part of the loop's checkpointed state.

Every rank sees the same all-reduced val/loss, but the stop decision is all-reduced once more
(any rank says stop → all stop): a rank that left the loop alone would hang the others in the
next collective. sbi's rule, which the parity recipe relies on: stop once ``patience``
evaluations in a row have not improved on the best val/loss.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from trainforge import distributed
from trainforge.distributed import WorkerContext


class EarlyStopping:
    def __init__(self, patience: int, keep_best: bool) -> None:
        self.patience = patience
        self.keep_best = keep_best
        self.best = math.inf
        self.best_epoch = 0
        self.since_best = 0
        self.stopped = False
        self.best_weights: dict[str, torch.Tensor] | None = None

    def update(self, val_loss: float, epoch: int, model: nn.Module, ctx: WorkerContext) -> bool:
        """Record one evaluation; True when training should stop (the same on every rank)."""
        if val_loss < self.best:
            self.best, self.best_epoch, self.since_best = val_loss, epoch, 0
            if self.keep_best:
                self.best_weights = {
                    k: v.detach().clone() for k, v in distributed.unwrap(model).state_dict().items()
                }
        else:
            self.since_best += 1
        if self.patience == 0:  # never stops: no vote to collect
            return False
        stop = self.since_best >= self.patience
        votes = distributed.all_reduce_sums({"stop": torch.tensor(float(stop))}, ctx.device)
        self.stopped = bool(votes["stop"].item() > 0)
        return self.stopped

    def restore_best(self, model: nn.Module) -> bool:
        """Put the best weights back; False when there are none to restore."""
        if self.best_weights is None:
            return False
        distributed.unwrap(model).load_state_dict(self.best_weights)
        return True

    def state_dict(self) -> dict[str, Any]:
        return {
            "best": self.best,
            "best_epoch": self.best_epoch,
            "since_best": self.since_best,
            "stopped": self.stopped,
            "best_weights": self.best_weights,
        }

    def load_state_dict(self, state: dict[str, Any], device: torch.device) -> None:
        self.best = float(state["best"])
        self.best_epoch = int(state["best_epoch"])
        self.since_best = int(state["since_best"])
        self.stopped = bool(state["stopped"])
        weights = state["best_weights"]
        self.best_weights = (
            None if weights is None else {k: v.to(device) for k, v in weights.items()}
        )
