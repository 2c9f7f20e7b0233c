"""The CPU tanh of sbi's MADE-based estimators (``trainforge.workloads.sbi.fast_tanh``): the
same function and gradient as torch's, taken only on large CPU tensors, put into sbi's MAF (and
nowhere else) without changing what it computes."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from tests.unit.sbi_helpers import DEBUG, _data, write_simulations
from trainforge import config
from trainforge.workloads.sbi import estimator as estimators
from trainforge.workloads.sbi import fast_tanh
from trainforge.workloads.sbi.config import EstimatorSection
from trainforge.workloads.sbi.workload import SBIWorkload


def test_the_identity_is_tanh_and_its_gradient_is_tanhs() -> None:
    x = torch.linspace(-20, 20, 200_001).reshape(-1, 1).requires_grad_()
    mine, theirs = fast_tanh.sigmoid_tanh(x), torch.tanh(x)
    assert (mine - theirs).abs().max().item() < 2.5e-7
    grad = torch.linspace(-1, 1, len(x)).reshape(-1, 1)
    (mine_grad,) = torch.autograd.grad(mine, x, grad)
    (their_grad,) = torch.autograd.grad(theirs, x, grad)
    assert (mine_grad - their_grad).abs().max().item() < 1e-6


def test_only_a_large_cpu_tensor_takes_the_identity() -> None:
    small = torch.randn(fast_tanh.MIN_ELEMENTS - 1, requires_grad=True)
    large = torch.randn(fast_tanh.MIN_ELEMENTS, requires_grad=True)
    assert type(fast_tanh.tanh(small).grad_fn).__name__ == "TanhBackward0"
    assert type(fast_tanh.tanh(large).grad_fn).__name__ == "_SigmoidTanhBackward"


@pytest.mark.parametrize("rows", [100, 1024])
def test_sbis_maf_computes_the_same_loss_and_gradients_with_it(rows: int) -> None:
    theta, x = _data()
    record = estimators.BuildRecord.from_config(EstimatorSection(model="maf"), 2, 2)
    theirs = estimators.EstimatorLoss(estimators.build(record, theta, x))
    mine = copy.deepcopy(theirs)
    # sbi's default MAF: five transforms, each a MADE and its two blocks holding tanh
    assert fast_tanh.use_in(mine) == 15
    batch = (theta[:rows], x[:rows])
    mine_loss, their_loss = mine(*batch).mean(), theirs(*batch).mean()
    torch.testing.assert_close(mine_loss, their_loss, rtol=1e-5, atol=1e-6)
    mine_loss.backward()
    their_loss.backward()
    for a, b in zip(mine.parameters(), theirs.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-4, atol=1e-6)


def test_estimators_without_tanh_are_left_as_built() -> None:
    theta, x = _data()
    record = estimators.BuildRecord.from_config(EstimatorSection(model="nsf"), 2, 2)
    assert fast_tanh.use_in(estimators.build(record, theta, x)) == 0


def test_the_sbi_workload_trains_its_maf_with_it(tmp_path: Path) -> None:
    cfg = config.load(DEBUG, [])
    assert cfg.workload.estimator.model == "maf"
    cfg.workload.simulation.path = str(write_simulations(tmp_path / "sims", n=600, chunk_size=200))
    workload = SBIWorkload(cfg.workload, seed=0)
    workload.datasets(torch.device("cpu"))
    model = workload.build_model()
    activations = [m.activation for m in model.modules() if hasattr(m, "activation")]
    # a MADE and its two blocks per transform, every one of them on the fast tanh
    assert len(activations) == 3 * cfg.workload.estimator.num_transforms
    assert set(activations) == {fast_tanh.tanh}
