"""Optimizer and LR schedule (``trainforge.optim``): warmup, cosine, linear, constant; the
optimizers torch's own, without importing ``torch._dynamo``."""

from __future__ import annotations

import itertools
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from trainforge import config, optim

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "recipes" / "cnn" / "digits_simple_cnn.yaml"


def train_section(*overrides: str):
    return config.load(DIGITS, list(overrides)).train


def test_warmup_rises_linearly_to_one() -> None:
    train = train_section("train.schedule=cosine", "train.warmup_steps=4")
    factors = [optim.lr_factor(step, 100, train) for step in range(4)]
    assert factors == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert optim.lr_factor(4, 100, train) == pytest.approx(1.0)  # decay starts from the peak


@pytest.mark.parametrize("min_lr_ratio", [0.0, 0.1])
def test_cosine_ends_at_min_lr_ratio(min_lr_ratio: float) -> None:
    train = train_section(
        "train.schedule=cosine", "train.warmup_steps=10", f"train.min_lr_ratio={min_lr_ratio}"
    )
    total = 110
    factors = [optim.lr_factor(step, total, train) for step in range(10, total + 1)]
    assert factors[0] == pytest.approx(1.0)
    assert factors[-1] == pytest.approx(min_lr_ratio)
    assert all(a >= b for a, b in itertools.pairwise(factors))
    assert optim.lr_factor(60, total, train) == pytest.approx((1 + min_lr_ratio) / 2)
    assert optim.lr_factor(total + 50, total, train) == pytest.approx(min_lr_ratio)


def test_linear_is_halfway_at_mid() -> None:
    train = train_section("train.schedule=linear", "train.min_lr_ratio=0.2")
    assert optim.lr_factor(0, 100, train) == pytest.approx(1.0)
    assert optim.lr_factor(50, 100, train) == pytest.approx(0.6)
    assert optim.lr_factor(25, 100, train) == pytest.approx(0.8)
    assert optim.lr_factor(100, 100, train) == pytest.approx(0.2)


def test_constant_stays_one() -> None:
    train = train_section("train.schedule=constant")
    assert {optim.lr_factor(step, 50, train) for step in range(60)} == {1.0}


def test_schedule_drives_the_optimizer() -> None:
    train = train_section("train.schedule=linear", "train.lr=0.1", "train.optimizer=sgd")
    model = nn.Linear(2, 1)
    optimizer = optim.build_optimizer(model, train)
    scheduler = optim.build_schedule(optimizer, train, total_steps=10)
    lrs = []
    for _ in range(10):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([0.1 * (1 - s / 10) for s in range(10)])


@pytest.mark.parametrize("capturable", [False, True])
def test_plateau_lowers_the_lr_after_patience_evaluations_without_a_new_best(
    capturable: bool,
) -> None:
    train = train_section(
        "train.schedule=plateau", "train.lr=0.1", "train.optimizer=adam",
        "train.plateau_patience=2", "train.plateau_factor=0.5", "train.min_lr_ratio=0.25",
        "train.warmup_steps=2",
    )  # fmt: skip
    model = nn.Linear(2, 1)
    optimizer = optim.build_optimizer(model, train, capturable=capturable)
    lr_tensor = optimizer.param_groups[0]["lr"]  # capturable: the tensor a graph would read
    scheduler = optim.build_schedule(optimizer, train, total_steps=0)

    def lr() -> float:
        return float(optimizer.param_groups[0]["lr"])

    assert lr() == pytest.approx(0.05)  # warmup first
    optimizer.step()
    scheduler.step()
    assert lr() == pytest.approx(0.1)
    lowered = [scheduler.evaluated(loss) for loss in (3.0, 2.0, 2.5, 2.1, 1.0, 1.5, 1.5)]
    assert lowered == [False, False, False, True, False, False, True]
    assert lr() == pytest.approx(0.025)  # applied at once, not at the next step
    optimizer.step()
    scheduler.step()
    assert lr() == pytest.approx(0.025)
    if capturable:
        assert optimizer.param_groups[0]["lr"] is lr_tensor  # filled in place
    # at the floor (min_lr_ratio 0.25) it stays, however long the plateau
    assert not any(scheduler.evaluated(2.0) for _ in range(6))
    assert lr() == pytest.approx(0.025)

    # a resumed run goes on counting where it stopped
    fresh = optim.build_schedule(optim.build_optimizer(model, train), train, total_steps=0)
    assert isinstance(fresh, optim.PlateauLR)
    fresh.load_state_dict(scheduler.state_dict())
    assert (fresh.scale, fresh.best, fresh.since_best) == (0.25, 1.0, scheduler.since_best)


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_the_cpu_takes_the_fused_optimizers_and_they_step_as_the_loop_does(name: str) -> None:
    """Fused on the CPU as on CUDA (2.3-4x faster steps on one thread: bench/optimizer_step_cpu.py);
    the same steps as torch's default implementation up to rounding."""
    train = train_section(f"train.optimizer={name}", "train.lr=0.05", "train.weight_decay=1e-3")
    torch.manual_seed(0)
    fused_model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    loop_model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    loop_model.load_state_dict(fused_model.state_dict())
    initial = [p.detach().clone() for p in fused_model.parameters()]
    fused = optim.build_optimizer(fused_model, train)
    assert fused.defaults["fused"] is True
    settings = {k: v for k, v in fused.defaults.items() if k != "decoupled_weight_decay"}
    loop = type(fused)(loop_model.parameters(), **{**settings, "fused": None})  # AdamW's is fixed
    batch = torch.randn(16, 4), torch.randn(16, 1)
    for _ in range(5):
        for model, optimizer in ((fused_model, fused), (loop_model, loop)):
            optimizer.zero_grad()
            nn.functional.mse_loss(model(batch[0]), batch[1]).backward()
            optimizer.step()
    pairs = zip(fused_model.parameters(), loop_model.parameters(), initial, strict=True)
    for after_fused, after_loop, before in pairs:
        torch.testing.assert_close(after_fused, after_loop, rtol=1e-5, atol=1e-6)
        assert not torch.equal(after_fused, before)  # it stepped


def test_a_capturable_optimizer_on_the_cpu_is_not_fused() -> None:
    """CUDA graphs are CUDA's: only a test builds a capturable optimizer on the CPU."""
    optimizer = optim.build_optimizer(nn.Linear(2, 1), train_section("train.optimizer=adam"),
                                      capturable=True)  # fmt: skip
    assert not optimizer.defaults["fused"] and optimizer.defaults["capturable"]


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw"])
def test_the_optimizers_step_and_save_as_torchs_own(name: str) -> None:
    """``optim.WithoutDynamo`` calls torch's methods without their decorators: the same steps,
    bit for bit, under a schedule, and state dicts that either class loads."""
    train = train_section(
        f"train.optimizer={name}", "train.lr=0.05", "train.weight_decay=1e-3",
        "train.momentum=0.9", "train.schedule=cosine", "train.warmup_steps=2",
    )  # fmt: skip
    torch.manual_seed(0)
    ours_model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    torch_model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    torch_model.load_state_dict(ours_model.state_dict())
    ours = optim.build_optimizer(ours_model, train)
    assert isinstance(ours, optim.WithoutDynamo) and type(ours).torch_class is not type(ours)
    settings = {k: v for k, v in ours.defaults.items() if k != "decoupled_weight_decay"}
    theirs = type(ours).torch_class(torch_model.parameters(), **settings)
    schedules = [optim.build_schedule(o, train, total_steps=6) for o in (ours, theirs)]
    batch = torch.randn(16, 4), torch.randn(16, 1)
    for _ in range(6):
        for model, optimizer, schedule in zip((ours_model, torch_model), (ours, theirs),
                                              schedules, strict=True):  # fmt: skip
            optimizer.zero_grad(set_to_none=True)
            nn.functional.mse_loss(model(batch[0]), batch[1]).backward()
            optimizer.step()
            schedule.step()
    for a, b in zip(ours_model.parameters(), torch_model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert all(p.grad is not None for p in ours_model.parameters())
    ours.zero_grad(set_to_none=True)
    assert all(p.grad is None for p in ours_model.parameters())

    saved_ours, saved_theirs = ours.state_dict(), theirs.state_dict()
    assert saved_ours["param_groups"] == saved_theirs["param_groups"]
    assert saved_ours["state"].keys() == saved_theirs["state"].keys()
    for index, state in saved_ours["state"].items():
        other = saved_theirs["state"][index]
        assert state.keys() == other.keys()
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(value), torch.as_tensor(other[key]))
    fresh = optim.build_optimizer(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)),
                                  train)  # fmt: skip
    fresh.load_state_dict(saved_theirs)  # a checkpoint of torch's class loads into ours
    assert fresh.state_dict()["param_groups"] == saved_theirs["param_groups"]


def _trained(train, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    optimizer = optim.build_optimizer(model, train)
    scheduler = optim.build_schedule(optimizer, train, total_steps=20)
    for _ in range(steps):
        model(torch.randn(4, 3)).pow(2).mean().backward()
        optimizer.step()
        scheduler.step()
    return scheduler


@pytest.mark.parametrize("schedule", ["cosine", "plateau"])
def test_a_resume_trains_on_with_its_own_recipes_lr_and_weight_decay(schedule: str) -> None:
    """A checkpoint's optimizer state carries the LR and weight decay it was trained with; the
    run that loads it (``checkpoint.allow_changes``) goes on with its own, on its schedule."""
    old = train_section(f"train.schedule={schedule}", "train.lr=0.002", "train.optimizer=adamw")
    saved = _trained(old, steps=6)
    new = train_section(f"train.schedule={schedule}", "train.lr=0.01", "train.optimizer=adamw",
                        "train.weight_decay=0.05")  # fmt: skip
    resumed = _trained(new, steps=0)
    optim.load_keeping_hyperparameters(resumed, saved.optimizer.state_dict(), saved.state_dict())
    (group,) = resumed.optimizer.param_groups
    assert (group["initial_lr"], group["weight_decay"]) == (0.01, 0.05)
    assert group["lr"] == pytest.approx(0.01 * optim.lr_factor(6, 20, new))
    assert resumed.last_epoch == 6  # the position is the checkpoint's
    moments = saved.optimizer.state_dict()["state"][0]["exp_avg"]
    assert torch.equal(resumed.optimizer.state_dict()["state"][0]["exp_avg"], moments)
    resumed.optimizer.step()  # and steps at the new LR from here on
    resumed.step()
    assert group["lr"] == pytest.approx(0.01 * optim.lr_factor(7, 20, new))


def test_an_unchanged_resume_loads_every_value_as_saved() -> None:
    train = train_section("train.schedule=cosine", "train.warmup_steps=3")
    saved = _trained(train, steps=5)
    resumed = _trained(train, steps=0)
    optim.load_keeping_hyperparameters(resumed, saved.optimizer.state_dict(), saved.state_dict())
    assert (
        resumed.optimizer.state_dict()["param_groups"]
        == (saved.optimizer.state_dict()["param_groups"])
    )
    assert resumed.state_dict() == saved.state_dict()


def test_building_stepping_and_saving_an_optimizer_imports_no_torch_dynamo() -> None:
    """torch's own optimizers import ``torch._dynamo`` (sympy and all: 0.9 s here, 3.5-5.3 s
    of a cold GPU worker) on their first ``add_param_group``; these never do. A new process,
    since this one may have imported it for another test."""
    code = """
import sys
import torch
from torch import nn
from trainforge import config, optim
for name in ("sgd", "adam", "adamw"):
    train = config.load(sys.argv[1], [f"train.optimizer={name}"]).train
    model = nn.Linear(3, 1)
    optimizer = optim.build_optimizer(model, train)
    schedule = optim.build_schedule(optimizer, train, total_steps=4)
    model(torch.randn(2, 3)).sum().backward()
    optimizer.step()
    schedule.step()
    optimizer.zero_grad()
    optimizer.load_state_dict(optimizer.state_dict())
print(sorted(name for name in sys.modules if name.startswith("torch._dynamo")))
"""
    done = subprocess.run([sys.executable, "-c", code, str(DIGITS)], capture_output=True,
                          text=True, timeout=120, check=True)  # fmt: skip
    assert done.stdout.strip() == "[]"
