"""sbi's validation split rule: seeded, disjoint, the last int(fraction·n) rows (at least one)."""

from __future__ import annotations

import torch

from trainforge.workloads.sbi.split import split_order


def test_the_split_is_a_seeded_partition_with_sbis_sizes() -> None:
    train, val = split_order(1000, 0.1, seed=3)
    assert (len(train), len(val)) == (900, 100)
    assert torch.equal(torch.cat([train, val]).sort().values, torch.arange(1000))
    again_train, again_val = split_order(1000, 0.1, seed=3)
    assert torch.equal(train, again_train) and torch.equal(val, again_val)
    assert not torch.equal(val, split_order(1000, 0.1, seed=4)[1])


def test_a_tiny_set_still_validates_on_one_row() -> None:
    train, val = split_order(5, 0.1, seed=0)
    assert (len(train), len(val)) == (4, 1)
