"""Mixed precision (``trainforge.precision``): autocast per dtype, the fp16 GradScaler and its
checkpointed state."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from trainforge import checkpoint
from trainforge.precision import Precision

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def optimizer_imports() -> None:
    """torch imports torch._dynamo lazily (~1 s) when the first optimizer is built: pay it once
    here, in setup, rather than inside whichever test happens to build one first."""
    torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)


@pytest.mark.usefixtures("optimizer_imports")
def test_fp16_scaler_state_survives_a_checkpoint(tmp_path: Path) -> None:
    precision = Precision("fp16", CPU)
    assert precision.scaler.is_enabled()
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        precision.backward(loss)
        norm = precision.step(optimizer, list(model.parameters()), 1.0, measure_norm=True)
        assert norm is not None and torch.isfinite(norm)
        optimizer.zero_grad()
    precision.scaler.update(new_scale=1024.0)  # a scale no fresh scaler has
    state = precision.state_dict()
    assert state["scale"] == 1024.0
    assert state["_growth_tracker"] == 3

    checkpoint.save(tmp_path, {"scaler": state}, "recipe: x\n")
    loaded = checkpoint.load(tmp_path)
    assert (tmp_path / checkpoint.RECIPE_FILE).read_text() == "recipe: x\n"
    fresh = Precision("fp16", CPU)
    assert fresh.state_dict() != state
    fresh.load_state_dict(loaded["scaler"])
    assert fresh.state_dict() == state
    assert fresh.scaler.get_scale() == 1024.0


def test_bf16_autocast_on_cpu() -> None:
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with Precision("bf16", CPU).autocast():
        assert (a @ b).dtype == torch.bfloat16
    assert (a @ b).dtype == torch.float32
    assert not Precision("bf16", CPU).scaler.is_enabled()


def test_fp32_autocast_is_a_no_op() -> None:
    """A matmul (which CPU autocast runs in bf16) gives the very bits it gives outside any
    autocast context; under bf16 autocast the same matmul gives other values, so the
    comparison can tell the two apart."""
    generator = torch.Generator().manual_seed(0)
    a, b = torch.randn(16, 16, generator=generator), torch.randn(16, 16, generator=generator)
    outside = a @ b  # before any Precision exists: no autocast anywhere
    assert not torch.is_autocast_enabled("cpu")
    with Precision("fp32", CPU).autocast():
        assert not torch.is_autocast_enabled("cpu")
        inside = a @ b
    assert inside.dtype == torch.float32 and torch.equal(inside, outside)
    with Precision("bf16", CPU).autocast():
        lowered = a @ b
    assert lowered.dtype == torch.bfloat16
    assert not torch.equal(lowered.float(), outside)
    torch.testing.assert_close(lowered.float(), outside, rtol=0.05, atol=0.1)  # the same product

    precision = Precision("fp32", CPU)
    assert not precision.scaler.is_enabled()
    assert precision.state_dict() == {}
    precision.load_state_dict(precision.state_dict())  # empty state: nothing to load
    assert not precision.scaler.is_enabled()
