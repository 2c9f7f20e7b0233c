"""GPU tier for the CUDA-graph step on the CNN workload (``trainforge.worker.step``).

The CIFAR recipe's step — ResNet-18 with BatchNorm, random crop and flip on the GPU,
channels_last — replayed from a CUDA graph is the eager step, loss by loss, with SGD (Nesterov
momentum, weight decay) and with AdamW, under a warm-up + cosine LR schedule: on one GPU, and
on two, where the graphed step's own gradient all-reduce (``gradient_averaging``) is captured
too and the eager step it is checked against runs under DDP.

Step by step: before each step the eager model and optimizer take the graphed run's state, the
two take the same step from it, and their losses, weight updates, BatchNorm running-statistics
updates and random draws must agree. That holds for the graphed step's first steps too, the
eager ones it takes before capture (3): they train, as any step. Comparing whole
trajectories instead would compare float rounding amplified by training (the eager step reads
a float LR, the graph a float32 tensor; AdamW's first updates are gradient signs). fp32,
deterministic cuDNN, no TF32.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from tests.gpu.ranks import flat_parameters, gather, run_on_gpus
from trainforge import config, distributed
from trainforge.data.types import Batch, TensorData
from trainforge.distributed import WorkerContext
from trainforge.gradient_averaging import AveragedModule
from trainforge.optim import (
    build_optimizer,
    build_schedule,
    load_keeping_hyperparameters,
    lr_factor,
)
from trainforge.precision import Precision
from trainforge.worker.step import Stepper
from trainforge.workloads.cnn.config import CNNWorkloadConfig
from trainforge.workloads.cnn.workload import CNNWorkload

pytestmark = [pytest.mark.gpu]

CIFAR = Path(__file__).resolve().parents[2] / "recipes" / "cnn" / "cifar10_resnet18.yaml"
STEPS, BATCH = 16, 64  # 16: 3 eager steps, the capture's step, 12 replays
OPTIMIZERS = [("sgd", 0.05), ("adamw", 1e-3)]  # (train.optimizer, peak LR)


@pytest.fixture(autouse=True)
def deterministic() -> Iterator[None]:
    cudnn, matmul = torch.backends.cudnn, torch.backends.cuda.matmul
    before = (cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32)
    cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32 = (
        True, False, False, False,
    )  # fmt: skip
    yield
    cudnn.deterministic, cudnn.benchmark, cudnn.allow_tf32, matmul.allow_tf32 = before


def cifar_like(device: torch.device, seed: int) -> tuple[CNNWorkload, list[Batch]]:
    """The CIFAR recipe's workload (augmentation on) over synthetic images: 16 batches of 64."""
    section = CNNWorkloadConfig(
        model="resnet18_cifar", dataset="synthetic", synthetic_train_size=STEPS * BATCH,
        synthetic_val_size=BATCH, augment=True,
    )  # fmt: skip
    workload = CNNWorkload(section, seed=seed, channels_last=True)
    train, _ = workload.datasets(device)
    assert isinstance(train, TensorData)
    images, labels = train.tensors
    return workload, [
        (images[i : i + BATCH], labels[i : i + BATCH]) for i in range(0, STEPS * BATCH, BATCH)
    ]


def train_graphed(
    device: torch.device, optimizer: str, lr: float, ctx: WorkerContext, seed: int = 0
) -> nn.Module:
    """Sixteen steps of the graphed run, each checked against the eager step from the same
    state; returns the graphed model."""
    workload, batches = cifar_like(device, seed)
    train = config.load(
        CIFAR, [f"train.optimizer={optimizer}", f"train.lr={lr}", "train.warmup_steps=3"]
    ).train  # cosine after the warm-up, weight decay 5e-4, Nesterov momentum 0.9 for sgd
    precision = Precision("fp32", device)
    built = {}
    for graphs in (False, True):
        torch.manual_seed(0)
        model = workload.build_model().to(device, memory_format=torch.channels_last)
        opt = build_optimizer(model, train, capturable=graphs)
        notes: list[str] = []  # a failed capture would say why here
        wrapped = distributed.wrap(model, ctx, cuda_graphs=graphs)
        if ctx.world_size > 1:  # a graphed step averages with its own hooks, not DDP's
            assert isinstance(wrapped, AveragedModule if graphs else DistributedDataParallel)
        step = Stepper(wrapped, workload, precision, opt, None, graphs, notes.append)
        built[graphs] = (model, opt, step, notes)
    (eager_model, eager_opt, eager_step, _), (model, opt, step, notes) = built.values()
    schedule = build_schedule(opt, train, total_steps=STEPS)
    torch.cuda.manual_seed(100 + seed)  # the crops and flips
    lrs, losses = [], []
    for i, batch in enumerate(batches):
        before = {k: v.clone() for k, v in model.state_dict().items()}
        eager_model.load_state_dict(before)
        if i:  # at the first step: the graph's zeroed state against a fresh optimizer's
            take_optimizer_state(eager_opt, opt)
        lrs.append(float(opt.param_groups[0]["lr"]))
        eager_opt.param_groups[0]["lr"] = lrs[-1]
        rng = torch.cuda.get_rng_state(device)
        losses.append(step([batch])[0].item())
        drawn = torch.cuda.get_rng_state(device)
        torch.cuda.set_rng_state(rng, device)
        eager_loss = eager_step([batch])[0].item()
        assert not notes and step.graphed is not None, notes  # still the graphed step's
        assert torch.equal(torch.cuda.get_rng_state(device), drawn), i  # the same draws
        assert losses[-1] == pytest.approx(eager_loss, rel=1e-5), i
        assert_same_update(before, eager_model, model, i)
        schedule.step()
    assert len(set(lrs)) == STEPS - 1 and len(set(losses)) == STEPS  # the LR moved; it trained
    graphed = step.graphed  # replaying at the end, its eager steps taken
    assert graphed is not None and graphed.captured and not graphed.eager_steps_left
    return model


def take_optimizer_state(eager: torch.optim.Optimizer, graphed: torch.optim.Optimizer) -> None:
    pairs = zip(eager.param_groups[0]["params"], graphed.param_groups[0]["params"], strict=True)
    for mine, theirs in pairs:
        eager.state[mine] = {k: v.clone() for k, v in graphed.state[theirs].items()}


def assert_same_update(
    before: dict[str, torch.Tensor], eager: nn.Module, graphed: nn.Module, step: int
) -> None:
    """The step moved the weights, and BatchNorm's running statistics, as the eager step did:
    the difference of the two updates is under 1e-4 of the update (in norm, over all tensors
    of the kind; a frozen LR or a stale momentum buffer would be tens of percent)."""
    eager_state, graphed_state = eager.state_dict(), graphed.state_dict()
    kinds: dict[str, tuple[list[torch.Tensor], list[torch.Tensor]]] = {}
    for key, old in before.items():
        if not old.is_floating_point():  # BatchNorm's batch counts
            assert torch.equal(graphed_state[key], eager_state[key]), (step, key)
            continue
        kind = kinds.setdefault("running" if "running_" in key else "weights", ([], []))
        kind[0].append((eager_state[key] - old).flatten())
        kind[1].append((graphed_state[key] - old).flatten())
    for kind, (eager_deltas, graphed_deltas) in kinds.items():
        expected, got = torch.cat(eager_deltas), torch.cat(graphed_deltas)
        error = ((got - expected).norm() / expected.norm()).item()
        assert expected.norm() > 0 and error < 1e-4, (step, kind, error)


@pytest.mark.parametrize(("optimizer", "lr"), OPTIMIZERS)
def test_graphed_cnn_step_is_the_eager_step(optimizer: str, lr: float) -> None:
    device = torch.device("cuda", 0)
    train_graphed(device, optimizer, lr, WorkerContext(0, 0, 1, 0, device))


def _ddp_rank(ctx: WorkerContext) -> None:
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for optimizer, lr in OPTIMIZERS:
            model = train_graphed(ctx.device, optimizer, lr, ctx, seed=ctx.rank)  # its own data
            # the captured all-reduce kept the ranks' weights bitwise equal, as DDP does
            everyone = gather(flat_parameters(model), ctx.world_size)
            for other in everyone[1:]:
                assert torch.equal(other, everyone[0]), optimizer
    # the gradient accumulators and the eager steps share one stream; the capture runs on
    # another (faster) and torch's warning of that mismatch, once per process, is filtered
    # there: none reaches the user
    mismatched = [str(w.message)[:120] for w in caught if "stream does not match" in str(w.message)]
    assert not mismatched, mismatched


def test_graphed_cnn_ddp_step_is_the_eager_ddp_step() -> None:
    run_on_gpus(_ddp_rank)


@pytest.mark.parametrize(("optimizer", "lr"), OPTIMIZERS)
def test_a_capturable_optimizer_resumed_with_another_lr_steps_at_it(
    optimizer: str, lr: float
) -> None:
    """Graphed steps read the LR from a device tensor: a resume with a changed LR
    (``checkpoint.allow_changes``) fills that tensor with the new schedule's value, in place."""
    device = torch.device("cuda")

    def trained(peak: float, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
        torch.manual_seed(0)
        model = nn.Linear(8, 2).to(device)
        train = config.load(CIFAR, [f"train.optimizer={optimizer}", f"train.lr={peak}"]).train
        opt = build_optimizer(model, train, capturable=True)
        schedule = build_schedule(opt, train, total_steps=20)
        for _ in range(steps):
            model(torch.randn(4, 8, device=device)).square().mean().backward()
            opt.step()
            schedule.step()
        return schedule

    saved = trained(lr, steps=5)
    resumed = trained(lr * 3, steps=0)
    load_keeping_hyperparameters(resumed, saved.optimizer.state_dict(), saved.state_dict())
    (group,) = resumed.optimizer.param_groups
    tensor = group["lr"]  # what a graph captured from here on reads
    assert isinstance(tensor, torch.Tensor) and tensor.device.type == "cuda"
    train = config.load(CIFAR, [f"train.optimizer={optimizer}", f"train.lr={lr * 3}"]).train
    assert tensor.item() == pytest.approx(lr * 3 * lr_factor(5, 20, train), rel=1e-6)
    resumed.optimizer.step()  # steps (the moments are the checkpoint's)
    resumed.step()  # and the schedule fills the same tensor
    assert group["lr"] is tensor
    assert tensor.item() == pytest.approx(lr * 3 * lr_factor(6, 20, train), rel=1e-6)
