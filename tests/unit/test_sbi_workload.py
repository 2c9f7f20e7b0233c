"""The SBI workload (``trainforge.workloads.sbi.workload``) without Ray: its in-memory split of
the simulations by sbi's rule."""

from __future__ import annotations

import torch

from tests.unit.sbi_helpers import _data
from trainforge.workloads.sbi.workload import split


def test_split_follows_sbis_rule_and_is_deterministic() -> None:
    theta, x = _data(1000)
    (t1, _), (v1, _) = split(theta, x, 0.1, seed=3)
    (t2, _), (v2, _) = split(theta, x, 0.1, seed=3)
    assert len(t1) == 900 and len(v1) == 100
    torch.testing.assert_close(t1, t2)
    torch.testing.assert_close(v1, v2)
    rows = {tuple(r) for r in torch.cat([t1, v1]).tolist()}
    assert len(rows) == 1000  # a partition: nothing lost, nothing twice
    (t3, _), _ = split(theta, x, 0.1, seed=4)
    assert not torch.equal(t1, t3)
