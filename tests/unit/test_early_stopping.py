"""Early stopping (``trainforge.early_stopping``): sbi's patience rule, the best weights kept and
put back, and its state through a checkpoint file."""

from __future__ import annotations

import math
from pathlib import Path

import torch
from torch import nn

from trainforge import checkpoint
from trainforge.distributed import WorkerContext
from trainforge.early_stopping import EarlyStopping

CPU = torch.device("cpu")
CTX = WorkerContext(rank=0, local_rank=0, world_size=1, node_rank=0, device=CPU)


def model(value: float) -> nn.Module:
    layer = nn.Linear(2, 1)
    with torch.no_grad():
        for p in layer.parameters():
            p.fill_(value)
    return layer


def test_stops_after_patience_evaluations_without_improvement() -> None:
    stopper = EarlyStopping(patience=2, keep_best=False)
    net = model(0.0)
    decisions = [stopper.update(loss, epoch, net, CTX) for epoch, loss in
                 enumerate([1.0, 0.8, 0.9, 0.7, 0.7, 0.75], start=1)]  # fmt: skip
    # 0.9 is one miss, 0.7 resets, an equal loss is no improvement: stop at the second miss
    assert decisions == [False, False, False, False, False, True]
    assert stopper.stopped
    assert (stopper.best, stopper.best_epoch, stopper.since_best) == (0.7, 4, 2)
    assert stopper.best_weights is None  # not asked to keep them


def test_patience_zero_never_stops() -> None:
    stopper = EarlyStopping(patience=0, keep_best=True)
    net = model(0.0)
    assert not any(stopper.update(1.0 + i, i, net, CTX) for i in range(1, 20))
    assert not stopper.stopped and stopper.best_epoch == 1


def test_keeps_and_restores_the_best_weights() -> None:
    stopper = EarlyStopping(patience=3, keep_best=True)
    net = model(1.0)
    assert not stopper.restore_best(net)  # nothing seen yet
    stopper.update(0.5, 1, net, CTX)
    with torch.no_grad():
        net.weight.fill_(2.0)  # training goes on, validation gets worse
    stopper.update(0.6, 2, net, CTX)
    assert stopper.restore_best(net)
    assert torch.equal(net.weight, torch.ones(1, 2))


def test_state_survives_a_checkpoint(tmp_path: Path) -> None:
    stopper = EarlyStopping(patience=3, keep_best=True)
    net = model(1.0)
    stopper.update(0.5, 1, net, CTX)
    stopper.update(0.6, 2, net, CTX)
    checkpoint.save(tmp_path, {"early_stopping": stopper.state_dict()}, "")
    restored = EarlyStopping(patience=3, keep_best=True)
    assert restored.best == math.inf
    restored.load_state_dict(checkpoint.load(tmp_path)["early_stopping"], CPU)
    assert (restored.best, restored.best_epoch, restored.since_best, restored.stopped) == (
        0.5, 1, 1, False,
    )  # fmt: skip
    assert restored.best_weights is not None
    assert torch.equal(restored.best_weights["weight"], torch.ones(1, 2))
    # it goes on counting where it left off: one more miss of the patience of 3 stops
    assert not restored.update(0.7, 3, net, CTX)
    assert restored.update(0.7, 4, net, CTX)


def test_early_stopping_stops_after_patience_and_keeps_the_best_weights() -> None:
    model = torch.nn.Linear(2, 1)
    stopper = EarlyStopping(patience=2, keep_best=True)
    decisions = []
    for epoch, loss in enumerate([3.0, 2.0, 2.5, 1.5, 1.6, 1.7, 1.4], start=1):
        with torch.no_grad():
            model.weight.fill_(loss)
        decisions.append(stopper.update(loss, epoch, model, CTX))
        if decisions[-1]:
            break
    assert decisions == [False, False, False, False, False, True]
    assert stopper.best == 1.5 and stopper.best_epoch == 4
    assert stopper.restore_best(model)
    assert float(model.weight[0, 0].detach()) == 1.5
    fresh = EarlyStopping(patience=2, keep_best=True)
    fresh.load_state_dict(stopper.state_dict(), torch.device("cpu"))
    assert fresh.stopped and fresh.best == 1.5 and fresh.best_weights is not None


def test_no_patience_never_stops() -> None:
    stopper = EarlyStopping(patience=0, keep_best=False)
    model = torch.nn.Linear(1, 1)
    assert not any(stopper.update(float(i), i, model, CTX) for i in range(1, 50))
    assert not stopper.restore_best(model)
