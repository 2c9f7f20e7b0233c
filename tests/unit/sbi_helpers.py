"""Shared by the SBI unit tests: simulations drawn from a built-in task's prior and simulator."""

from __future__ import annotations

import torch

from trainforge.workloads.sbi.tasks import get_task


def _data(n: int = 2000, task: str = "two_moons") -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    t = get_task(task)
    theta = t.prior_sample(n, generator)
    return theta, t.simulate(theta, generator)
