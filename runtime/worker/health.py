"""The run stops when its training loss turns NaN or inf, before it logs or saves it.

Checked without a per-step host sync: the loss is summed on the device between logging steps
(``Trainer.loss_sum``), and a single non-finite step makes that sum non-finite. Each rank's
verdict travels in the logging step's all-reduce (one more tiny tensor in the same collective),
so every rank stops at the same step; before a checkpoint the window so far is checked with one
small all-reduce of its own (the weights checked too), so no checkpoint ever holds weights
trained on a non-finite loss.
GradScaler's skipped fp16 steps overflow in the gradients, not the loss: they don't count.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from trainforge import distributed
from trainforge.distributed import WorkerContext
from trainforge.errors import CollectiveFailed, NonFiniteLoss


def nonfinite_flags(loss_sum: torch.Tensor, ctx: WorkerContext) -> torch.Tensor:
    """One entry per rank, 1 at this rank when its loss sum is not finite (on the device)."""
    flags = torch.zeros(ctx.world_size, dtype=torch.float64, device=loss_sum.device)
    flags[ctx.rank] = (~torch.isfinite(loss_sum)).to(torch.float64)
    return flags


def raise_if_nonfinite(
    summed_flags: torch.Tensor,
    mean_loss: float,
    step: int,
    weight_flags: torch.Tensor | None = None,
) -> None:
    """After the all-reduce: stop every rank when any rank's loss (or weights) was not finite.
    A reduction that did not complete is told apart from a non-finite loss: each rank adds 0 or
    1 to its own entry only, and a rank flagged for its loss makes the summed loss non-finite."""
    loss_ranks = _ranks(summed_flags)
    weight_ranks = _ranks(weight_flags) if weight_flags is not None else []
    flags = summed_flags.tolist() + (weight_flags.tolist() if weight_flags is not None else [])
    if any(flag not in (0.0, 1.0) for flag in flags) or (loss_ranks and math.isfinite(mean_loss)):
        raise CollectiveFailed(
            f"the all-reduce of step {step} came back incomplete (non-finite flags "
            f"{summed_flags.tolist()} with a summed loss of {mean_loss}): a collective did not "
            "finish, as when a rank stopped responding and the watchdog aborted the communicator"
        )
    if loss_ranks:
        what = f"train/loss became {mean_loss} by step {step} ({_which(loss_ranks)})"
    elif weight_ranks:
        what = (
            f"the weights became non-finite by step {step} ({_which(weight_ranks)}) while "
            "train/loss was finite (an overflowing gradient)"
        )
    else:
        return
    raise NonFiniteLoss(f"{what}; the run stops here and keeps its checkpoints from before")


def check_before_save(
    loss_sum: torch.Tensor, model: nn.Module, ctx: WorkerContext, step: int
) -> None:
    """Before a checkpoint: the steps since the last logging step were all finite, and so are
    the weights (a finite loss can still send an overflowing gradient into them)."""
    weights_ok = torch.stack([p.detach().isfinite().all() for p in model.parameters()]).all()
    weights = torch.zeros(ctx.world_size, dtype=torch.float64, device=loss_sum.device)
    weights[ctx.rank] = (~weights_ok).to(torch.float64)
    summed = distributed.all_reduce_sums(
        {"loss": loss_sum, "nonfinite": nonfinite_flags(loss_sum, ctx), "weights": weights},
        ctx.device,
    )
    mean_loss = summed["loss"].item() / ctx.world_size
    raise_if_nonfinite(summed["nonfinite"], mean_loss, step, summed["weights"])


def _ranks(flags: torch.Tensor) -> list[int]:
    return [rank for rank, flag in enumerate(flags.tolist()) if flag > 0]


def _which(ranks: list[int]) -> str:
    return "rank " + ", ".join(map(str, ranks)) if len(ranks) < 4 else f"{len(ranks)} ranks"
