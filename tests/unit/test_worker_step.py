"""The optimizer step (``trainforge.worker.step``): the eager step over an accumulation window,
the ``Stepper`` that chooses between it and a CUDA-graph replay, the ``Snapshot`` that undoes
capture's warm-up, and the choice ``precision.cuda_graphs`` makes (capture itself needs a GPU:
tests/gpu/test_gpu_step.py, tests/gpu/test_sbi_gpu.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

from trainforge import config
from trainforge.data.types import Batch
from trainforge.optim import build_optimizer, build_schedule
from trainforge.precision import Precision
from trainforge.worker import step as step_module
from trainforge.worker.step import Snapshot, Stepper, cuda_graph_choice, optimizer_step
from trainforge.workloads.cnn.datasets import augment_batch

CPU = torch.device("cpu")
CIFAR = Path(__file__).resolve().parents[2] / "recipes" / "cnn" / "cifar10_resnet18.yaml"


class Regression:
    """The slice of a workload the step uses: a mean squared error."""

    def prepare_batch(self, batch: Batch, train: bool) -> Batch:
        return batch

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        features, values = batch
        return (model(features).squeeze(1) - values).pow(2).mean()


def model_and_optimizer(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Linear(4, 1)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def window(micro_steps: int, batch: int = 8) -> list[Batch]:
    generator = torch.Generator().manual_seed(micro_steps * batch)
    return [
        (torch.randn(batch, 4, generator=generator), torch.randn(batch, generator=generator))
        for _ in range(micro_steps)
    ]


def stepper(model: nn.Module, optimizer: torch.optim.Optimizer, **kwargs: Any) -> Stepper:
    options: dict[str, Any] = {"clip_grad_norm": None, "cuda_graphs": False, "note": print}
    options.update(kwargs)
    return Stepper(model, Regression(), Precision("fp32", CPU), optimizer, **options)  # type: ignore[arg-type]


def eager(
    model: nn.Module, optimizer: torch.optim.Optimizer, micro: list[Batch]
) -> tuple[torch.Tensor, torch.Tensor | None]:
    precision = Precision("fp32", CPU)
    return optimizer_step(model, micro, Regression(), precision, optimizer, None)  # type: ignore[arg-type]


def test_accumulated_window_equals_one_batch_of_all_of_it() -> None:
    """Two micro-batches of 8 with the loss divided by 2: the gradient of one batch of 16."""
    micro = window(2)
    whole = [(torch.cat([x for x, _ in micro]), torch.cat([y for _, y in micro]))]
    a, opt_a = model_and_optimizer()
    b, opt_b = model_and_optimizer()
    precision = Precision("fp32", CPU)
    loss_a, _ = optimizer_step(a, micro, Regression(), precision, opt_a, None)  # type: ignore[arg-type]
    loss_b, _ = optimizer_step(b, whole, Regression(), precision, opt_b, None)  # type: ignore[arg-type]
    torch.testing.assert_close(loss_a, loss_b)
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(p, q)
        assert p.grad is None  # gradients cleared for the next window


def test_eager_stepper_is_the_eager_step() -> None:
    a, opt_a = model_and_optimizer()
    b, opt_b = model_and_optimizer()
    step = stepper(a, opt_a, clip_grad_norm=1.0)
    precision = Precision("fp32", CPU)
    for micro_steps in (1, 2, 3):
        got = step(window(micro_steps))
        expected = optimizer_step(b, window(micro_steps), Regression(), precision, opt_b, 1.0)  # type: ignore[arg-type]
        assert torch.equal(got[0], expected[0])
        assert got[1] is not None and expected[1] is not None
        assert torch.equal(got[1], expected[1])
    for p, q in zip(a.parameters(), b.parameters(), strict=True):
        assert torch.equal(p, q)


def test_the_norm_is_measured_only_when_asked_or_clipping() -> None:
    model, optimizer = model_and_optimizer()
    step = stepper(model, optimizer)
    assert step(window(1))[1] is None  # no clipping, not asked: no norm, no extra kernels
    # the norm of the gradient at the weights the second step starts from, computed here
    reference = nn.Linear(4, 1)
    reference.load_state_dict(model.state_dict())
    Regression().loss(reference, window(1)[0]).backward()
    expected = torch.cat([p.grad.flatten() for p in reference.parameters()]).norm()  # type: ignore[union-attr]
    norm = step(window(1), measure_norm=True)[1]
    assert norm is not None
    torch.testing.assert_close(norm, expected)


class FakeGraph:
    """Stands in for GraphedStep (capture needs a GPU)."""

    made: ClassVar[list[FakeGraph]] = []
    capture_works: ClassVar[bool] = True

    def __init__(self, *args: Any) -> None:  # GraphedStep's arguments
        self.captured = self.capture_works
        self.error = "operation not permitted when stream is capturing"
        self.replayed: list[Batch] = []
        FakeGraph.made.append(self)

    def __call__(self, batch: Batch) -> tuple[torch.Tensor, ...]:
        self.replayed.append(batch)
        return torch.tensor(1.0), torch.tensor(2.0)


@pytest.fixture
def fake_graph(monkeypatch: pytest.MonkeyPatch) -> type[FakeGraph]:
    FakeGraph.made = []
    monkeypatch.setattr(step_module, "GraphedStep", FakeGraph)
    return FakeGraph


def test_graphs_are_captured_once_at_the_first_step(fake_graph: type[FakeGraph]) -> None:
    model, optimizer = model_and_optimizer()
    before = [p.detach().clone() for p in model.parameters()]
    notes: list[str] = []
    step = stepper(model, optimizer, cuda_graphs=True, note=notes.append)
    batches = [window(1) for _ in range(3)]
    for batch in batches:
        loss, norm = step(batch)
        assert norm is not None and (loss.item(), norm.item()) == (1.0, 2.0)
    assert len(fake_graph.made) == 1 and not notes
    assert [id(b) for b in fake_graph.made[0].replayed] == [id(w[0]) for w in batches]
    for p, q in zip(before, model.parameters(), strict=True):
        assert torch.equal(p, q)  # every step was the graph's, none eager


def test_a_failed_capture_goes_on_with_eager_steps(
    fake_graph: type[FakeGraph], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(FakeGraph, "capture_works", False)
    model, optimizer = model_and_optimizer()
    reference, reference_optimizer = model_and_optimizer()
    notes: list[str] = []
    step = stepper(model, optimizer, cuda_graphs=True, note=notes.append)
    for _ in range(3):
        step(window(1))
        eager(reference, reference_optimizer, window(1))
    assert len(fake_graph.made) == 1  # not retried
    assert notes == [
        "CUDA graph capture failed, eager steps: operation not permitted when stream is capturing"
    ]
    for p, q in zip(reference.parameters(), model.parameters(), strict=True):
        assert torch.equal(p, q)


class AugmentedBatchNormNet(nn.Module):
    """BatchNorm (running statistics: buffers the warm-up changes) after a random crop and
    flip (draws from the device's random stream, as the CNN workload's augmentation does)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.BatchNorm2d(4)
        self.head = nn.Linear(4, 1)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        features = self.norm(self.conv(augment_batch(images))).relu()
        return self.head(features.mean(dim=(2, 3)))


def sgd_training(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer, Any]:
    """The CIFAR recipe's optimizer (SGD, Nesterov momentum, weight decay, cosine schedule with
    warm-up), built as the graphed step builds it: the LR in a tensor."""
    torch.manual_seed(seed)
    model = AugmentedBatchNormNet()
    train = config.load(CIFAR, ["train.warmup_steps=2"]).train
    optimizer = build_optimizer(model, train, lr=0.1, capturable=True)
    return model, optimizer, build_schedule(optimizer, train, total_steps=8)


def image_steps(count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(1)
    return [
        (torch.randn(6, 3, 8, 8, generator=generator), torch.randn(6, generator=generator))
        for _ in range(count)
    ]


def sgd_steps(
    model: nn.Module, optimizer: torch.optim.Optimizer, schedule: Any, count: int
) -> list[float]:
    losses = []
    for images, values in image_steps(count):
        loss = (model(images).squeeze(1) - values).pow(2).mean()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        schedule.step()
        losses.append(loss.item())
    return losses


def test_undoing_the_warm_up_starts_training_where_it_would_have_started() -> None:
    """What capture needs before it — steps that create SGD's momentum buffers, move
    BatchNorm's running statistics and draw augmentation — undone by the snapshot: the run
    then goes on bitwise as a run without them (zeroed momentum is what a first step starts
    from), and the schedule still drives the LR tensor the graph reads."""
    model, optimizer, schedule = sgd_training()
    lr = optimizer.param_groups[0]["lr"]
    assert isinstance(lr, torch.Tensor)
    torch.manual_seed(7)
    snapshot = Snapshot(model, optimizer)
    for images, values in image_steps(3):  # the warm-up: no schedule step, as in capture
        (model(images).squeeze(1) - values).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    assert model.norm.num_batches_tracked.item() == 3
    assert all("momentum_buffer" in state for state in optimizer.state.values())
    snapshot.restore()
    assert model.norm.num_batches_tracked.item() == 0
    warmed = sgd_steps(model, optimizer, schedule, 6)
    assert optimizer.param_groups[0]["lr"] is lr  # updated in place, never replaced

    reference, reference_optimizer, reference_schedule = sgd_training()
    torch.manual_seed(7)
    assert warmed == sgd_steps(reference, reference_optimizer, reference_schedule, 6)
    for got, expected in zip(
        model.state_dict().values(), reference.state_dict().values(), strict=True
    ):
        assert torch.equal(got, expected)
    assert len(set(warmed)) == len(warmed)  # it did train: every step's loss differs


def test_cuda_graph_choice() -> None:
    cuda, cpu = torch.device("cuda", 0), CPU
    shipped = config.load(CIFAR)  # cuda_graphs: auto
    assert cuda_graph_choice(shipped, cuda, streamed=False) == (True, "")
    graphs, why = cuda_graph_choice(shipped, cuda, streamed=True)
    assert not graphs and why == (
        "precision.cuda_graphs=auto: eager steps, as the graphed step needs batches gathered "
        "on the device, and the data streams through a DataLoader"
    )
    assert cuda_graph_choice(shipped, cpu, streamed=False) == (
        False, "precision.cuda_graphs=auto: eager steps, as the graphed step needs GPU workers",
    )  # fmt: skip
    accumulating = config.load(CIFAR, ["train.grad_accum_steps=2"])
    graphs, why = cuda_graph_choice(accumulating, cuda, streamed=False)
    assert not graphs and why.endswith("needs train.grad_accum_steps=1") and "\n" not in why
    # true and false are the recipe's word, with no line (true's limits were checked at load)
    for setting, expected in (("true", True), ("false", False)):
        recipe = config.load(CIFAR, [f"precision.cuda_graphs={setting}"])
        assert cuda_graph_choice(recipe, cuda, streamed=True) == (expected, "")
