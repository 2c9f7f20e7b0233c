"""A loss or weights gone NaN/inf stop the run on every rank, naming the step and the rank."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from trainforge.distributed import WorkerContext
from trainforge.errors import CollectiveFailed, NonFiniteLoss
from trainforge.worker.health import check_before_save, nonfinite_flags, raise_if_nonfinite

CPU = torch.device("cpu")


def ctx(rank: int = 0, world_size: int = 1) -> WorkerContext:
    return WorkerContext(rank=rank, local_rank=rank, world_size=world_size, node_rank=0, device=CPU)


def test_each_rank_flags_only_its_own_entry() -> None:
    assert nonfinite_flags(torch.tensor(3.0), ctx(1, 3)).tolist() == [0.0, 0.0, 0.0]
    assert nonfinite_flags(torch.tensor(float("nan")), ctx(1, 3)).tolist() == [0.0, 1.0, 0.0]
    assert nonfinite_flags(torch.tensor(float("-inf")), ctx(2, 3)).tolist() == [0.0, 0.0, 1.0]


def test_the_summed_flags_name_the_ranks_and_the_step() -> None:
    raise_if_nonfinite(torch.zeros(4), 1.5, step=20)  # all finite: goes on
    with pytest.raises(NonFiniteLoss, match=r"train/loss became nan by step 20 \(rank 1, 3\)"):
        raise_if_nonfinite(torch.tensor([0.0, 1.0, 0.0, 1.0]), float("nan"), step=20)


def test_before_a_save_the_weights_are_checked_too() -> None:
    model = nn.Linear(3, 2)
    check_before_save(torch.tensor(0.7), model, ctx(), step=5)  # all finite: saves
    with torch.no_grad():
        model.weight[0, 0] = float("inf")
    with pytest.raises(NonFiniteLoss, match=r"weights became non-finite by step 5 \(rank 0\)"):
        check_before_save(torch.tensor(0.7), model, ctx(), step=5)
    with pytest.raises(NonFiniteLoss, match=r"train/loss became nan by step 6"):
        check_before_save(torch.tensor(float("nan")), nn.Linear(3, 2), ctx(), step=6)


def test_an_all_reduce_that_did_not_complete_is_not_called_a_non_finite_loss() -> None:
    """Seen on 2 H100s: NCCL's watchdog aborted the communicator of a rank waiting for a
    stopped one, and the step's reduction came back with both ranks flagged and a finite loss —
    which was reported as 'train/loss became 0.276'. No completed reduction holds that."""
    with pytest.raises(CollectiveFailed, match="all-reduce of step 30 came back incomplete"):
        raise_if_nonfinite(torch.tensor([1.0, 1.0]), 0.276, step=30)
    with pytest.raises(CollectiveFailed):
        raise_if_nonfinite(torch.tensor([0.0, 3.5e-8]), float("nan"), step=30)
    with pytest.raises(CollectiveFailed):
        raise_if_nonfinite(torch.zeros(2), 0.5, step=30, weight_flags=torch.tensor([0.0, 2.0]))
