"""sbi's rule for the validation split, in one place for simulations in memory and streamed
from disk: a permutation seeded with the run's seed, whose last ``int(val_fraction·n)`` rows
(at least one) validate."""

from __future__ import annotations

import torch


def split_order(n: int, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(training row numbers, validation row numbers) among ``n`` rows, in permutation order."""
    num_val = max(1, int(val_fraction * n))
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    return order[: n - num_val], order[n - num_val :]
