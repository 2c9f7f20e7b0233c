"""The optimizer step (``trainforge.worker.step``): the eager step over an accumulation window,
the ``Stepper`` that sends every step to the graphed step when asked (and goes on eagerly from
a failed capture), and the choice ``precision.cuda_graphs`` makes (capture itself needs a GPU:
tests/gpu/test_gpu_step.py, tests/gpu/test_sbi_gpu.py)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from torch import nn

from trainforge import config
from trainforge.data.types import Batch
from trainforge.precision import Precision
from trainforge.worker import step as step_module
from trainforge.worker.step import Stepper, cuda_graph_choice, optimizer_step

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
    """Stands in for GraphedStep (capture needs a GPU): its first ``EAGER_STEPS`` calls are
    real eager steps, as GraphedStep's are; the next one captures (or fails to: None) and
    replays, which here trains nothing."""

    EAGER_STEPS = 2
    made: ClassVar[list[FakeGraph]] = []
    capture_works: ClassVar[bool] = True

    def __init__(self, model: nn.Module, workload: Any, optimizer: Any, *args: Any) -> None:
        self.model, self.optimizer = model, optimizer
        self.error = "operation not permitted when stream is capturing"
        self.calls: list[Batch] = []
        self.on_side_steps = 0  # steps taken on its stream by the caller
        FakeGraph.made.append(self)

    @contextlib.contextmanager
    def on_side(self) -> Iterator[None]:
        self.on_side_steps += 1
        yield

    def __call__(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor] | None:
        self.calls.append(batch)
        if len(self.calls) <= self.EAGER_STEPS:
            loss, _ = eager(self.model, self.optimizer, [batch])
            return loss, torch.tensor(2.0)
        if not self.capture_works:
            return None
        return torch.tensor(1.0), torch.tensor(2.0)


@pytest.fixture
def fake_graph(monkeypatch: pytest.MonkeyPatch) -> type[FakeGraph]:
    FakeGraph.made = []
    monkeypatch.setattr(step_module, "GraphedStep", FakeGraph)
    return FakeGraph


def batches(count: int) -> list[list[Batch]]:
    generator = torch.Generator().manual_seed(3)
    return [[(torch.randn(8, 4, generator=generator), torch.randn(8, generator=generator))]
            for _ in range(count)]  # fmt: skip


def test_with_graphs_every_step_is_the_graphed_steps(fake_graph: type[FakeGraph]) -> None:
    """Its eager steps before capture included: they are the run's first steps."""
    model, optimizer = model_and_optimizer()
    reference, reference_optimizer = model_and_optimizer()
    notes: list[str] = []
    step = stepper(model, optimizer, cuda_graphs=True, note=notes.append)
    windows = batches(5)
    results = [step(w) for w in windows]
    assert len(fake_graph.made) == 1 and not notes
    assert [id(b) for b in fake_graph.made[0].calls] == [id(w[0]) for w in windows]
    for w in windows[: FakeGraph.EAGER_STEPS]:  # the steps that trained; replays here do not
        eager(reference, reference_optimizer, w)
    for p, q in zip(reference.parameters(), model.parameters(), strict=True):
        assert torch.equal(p, q)
    assert [r[1].item() for r in results] == [2.0] * 5  # type: ignore[union-attr]


def test_a_failed_capture_goes_on_with_eager_steps_from_that_batch(
    fake_graph: type[FakeGraph], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No batch is lost: the one the capture failed on is stepped eagerly, as every later one,
    on the graphed step's stream; the run is then the eager run, bitwise."""
    monkeypatch.setattr(FakeGraph, "capture_works", False)
    model, optimizer = model_and_optimizer()
    reference, reference_optimizer = model_and_optimizer()
    notes: list[str] = []
    step = stepper(model, optimizer, cuda_graphs=True, note=notes.append)
    windows = batches(5)
    losses = [step(w)[0] for w in windows]
    expected = [eager(reference, reference_optimizer, w)[0] for w in windows]
    assert len(fake_graph.made) == 1 and len(fake_graph.made[0].calls) == 3  # not retried
    # the failed batch's step and the later ones on the graphed step's stream, DDP's
    assert fake_graph.made[0].on_side_steps == 3
    assert notes == [
        "CUDA graph capture failed, eager steps: operation not permitted when stream is capturing"
    ]
    assert [x.item() for x in losses] == [x.item() for x in expected]
    for p, q in zip(reference.parameters(), model.parameters(), strict=True):
        assert torch.equal(p, q)


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
