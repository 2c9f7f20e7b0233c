"""The optimizer step: eager (``optimizer_step``: micro-batches with DDP's ``no_sync`` on all
but the last, unscale, clip, step), or the whole step — forward, backward, gradient clipping,
optimizer update — captured once as a CUDA graph and replayed for every batch (``GraphedStep``).
``Stepper`` is what the loop calls: it chooses between the two, and goes on with eager steps
when capture fails.

Why: the SBI estimators (tens of thousands of parameters, dozens of small layers) are bound by
kernel launches and Python, not arithmetic: an eager step of sbi's MAF costs ~9 ms on an H200
whatever the batch. Replaying a graph is one launch per step.

How (PyTorch's "whole-network capture"): every tensor of the batch is copied into a static
tensor of its own; the optimizer is capturable with its learning rate in a device tensor (so the
LR schedule still applies, through ``fill_``); gradients are created inside the graph (set to
None before capture), so each replay writes fresh gradients instead of accumulating. Capture
needs eager steps on a side stream before it (3; 11 with DDP): these are the run's first
steps, on its first batches, and they train like any other, so a graphed run's first step is
done as soon as an eager run's (not after all of them and the capture, thrown away). The
capture, on the batch after them, runs no kernel and so changes no weight; the device's random
stream is put back after it, so a graphed run crops and flips exactly as the eager run would.

On several GPU workers the gradient all-reduce is captured too (NCCL allows collectives in a
graph): the model is not wrapped in DDP but in an ``AveragedModule``, which averages its
gradients with hooks of its own (``gradient_averaging.py``, launched during the backward pass
as DDP's buckets are, without DDP's copy of every gradient into a bucket). The eager steps run
on a side stream (``distributed.step_stream``), where their backward passes make the
parameters' gradient accumulators, so an eager backward needs no sync with them. The capture
runs on a stream of its own: in the graph the accumulators' work is then ordered after the
backward's by graph edges, not by one stream, and it overlaps the backward (2 H200s: +1.5-2.5%
at 2 GPUs against capture on the accumulators' stream, equal on one). Torch warns of that
mismatch once per process at capture ("may incur unnecessary synchronization"): the filter
around the capture names that message alone. A model wrapped in DDP
(``bench/ddp_scaling_options.py`` compares the two) is captured too, after 11 eager steps, as
PyTorch's CUDA notes ask (DDP finishes setting up its buckets and logging in the first ten; it
must be built on the side stream). The notes also ask
for NCCL's asynchronous error handling off; capture and replay work with it on
(``TORCH_NCCL_ASYNC_ERROR_HANDLING=1``, as every worker's process-group join sets it, tested on
H200s).

Every optimizer: Adam and AdamW capturable (step counter and LR on the device), SGD fused with
its LR in a device tensor (``optim.build_optimizer``). BatchNorm's running statistics and the
GPU-side augmentation run inside the graph: the running statistics are buffers updated in
place; the augmentation's random numbers come from the device generator, which a replay
advances by what the captured step draws, as an eager step would.

Limits: GPU workers, no gradient accumulation (one fixed step per graph), no fp16 (its
GradScaler decides on the host whether to step), no ``precision.compile``, and every training
batch the same shape (the loop drops partial batches anyway). ``precision.cuda_graphs: true``
refuses a recipe outside them when it is loaded; ``auto`` takes eager steps and says why in
one line (``cuda_graph_choice``), also when the training data streams through a DataLoader.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainforge import distributed
from trainforge.config.schema import Recipe, cuda_graph_blocker
from trainforge.data.types import Batch
from trainforge.precision import Precision
from trainforge.workloads.base import Workload

WARMUP_STEPS = 3
DDP_WARMUP_STEPS = 11
ACCUMULATOR_STREAM_WARNING = "The AccumulateGrad node's stream does not match"
"""The start of torch's warning at the capture (a regex for ``warnings``)."""


class GraphedStep:
    """The whole optimizer step as one CUDA graph: ``graphed(batch) -> (loss, norm)``, both
    fresh tensors, or None where the capture failed (``error`` says why; that batch's step is
    then the caller's to take, eager, as every later one).

    The first ``WARMUP_STEPS`` calls (``DDP_WARMUP_STEPS`` under DDP) are eager steps on a side
    stream, the step's own code, as capture asks before it; the next call captures the step on
    its batch and replays it; every later call replays it."""

    def __init__(
        self,
        model: nn.Module,
        workload: Any,
        optimizer: torch.optim.Optimizer,
        clip_grad_norm: float | None,
        autocast: Any,
    ) -> None:
        self.model, self.workload, self.optimizer, self.autocast = (
            model, workload, optimizer, autocast,
        )  # fmt: skip
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.max_norm = clip_grad_norm if clip_grad_norm is not None else float("inf")
        ddp = isinstance(model, DistributedDataParallel)  # never compiled: refused with graphs
        self.eager_steps_left = DDP_WARMUP_STEPS if ddp else WARMUP_STEPS
        # eager steps on the side stream (``distributed.step_stream``); the capture on a stream
        # of its own (the module's docstring: faster on several GPUs)
        self.side = distributed.step_stream(self.params[0].device)
        self.capture_stream = torch.cuda.Stream(self.params[0].device)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.batch: tuple[torch.Tensor, ...] = ()  # the graph reads its batch from these
        self.error = ""

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor] | None:
        """One optimizer step on this batch: (loss, pre-clip gradient norm), or None where the
        capture failed."""
        if self.eager_steps_left:
            self.eager_steps_left -= 1
            return self._eager(batch)
        if self.graph is None and not self._capture(batch):
            return None
        assert self.graph is not None
        for static, tensor in zip(self.batch, batch, strict=True):
            static.copy_(tensor)
        self.graph.replay()
        return self.loss.clone(), self.norm.clone()

    def _body(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        with self.autocast():
            loss = self.workload.loss(self.model, self.workload.prepare_batch(batch, True))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.params, self.max_norm, foreach=True)
        self.optimizer.step()
        return loss.detach().float(), norm

    def on_side(self) -> contextlib.AbstractContextManager[None]:
        """Work on the side stream, ordered after the work that made its inputs and before
        whatever reads its results: the eager steps before capture, and every step after a
        failed one (``Stepper``: the gradient accumulators are this stream's)."""
        return distributed.on_step_stream(self.params[0].device)

    def _eager(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """A step before capture, on the side stream."""
        with self.on_side():
            self.optimizer.zero_grad(set_to_none=True)
            return self._body(batch)

    def _capture(self, example: Batch) -> bool:
        device = self.params[0].device
        random_stream = torch.cuda.get_rng_state(device)
        self.batch = tuple(t.detach().clone() for t in example)
        self.graph = torch.cuda.CUDAGraph()
        self.optimizer.zero_grad(set_to_none=True)
        current = torch.cuda.current_stream(device)
        try:
            with (
                warnings.catch_warnings(),
                torch.cuda.graph(self.graph, stream=self.capture_stream),
            ):
                warnings.filterwarnings("ignore", ACCUMULATOR_STREAM_WARNING, UserWarning)
                self.loss, self.norm = self._body(self.batch)
        except RuntimeError as exc:
            # Data-dependent control flow (e.g. nflows' spline domain checks) cannot be
            # captured: the caller goes on with eager steps. When the capture's end raises,
            # torch's graph context never leaves its stream: the thread is put back on its own,
            # or every later step and evaluation would run on the capture stream, unordered
            # with the default stream's work.
            torch.cuda.set_stream(current)
            self.graph, self.error = None, " ".join(str(exc).split())[:200]
            self.optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            _end_generator_capture(device)
        torch.cuda.set_rng_state(random_stream, device)
        return self.graph is not None


def _end_generator_capture(device: torch.device) -> None:
    """A capture that fails never reaches its end, where the device's random generator leaves
    capture mode: every later draw on the device would fail ("Offset increment outside graph
    capture encountered unexpectedly"), such as the posterior's samples after training. A
    capture that succeeds, of one small op, starts and ends that mode again."""
    scratch = torch.zeros(1, device=device)
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        scratch.add_(1)
    torch.cuda.synchronize(device)


def optimizer_step(
    model: nn.Module,
    window: list[Batch],
    workload: Workload,
    precision: Precision,
    optimizer: torch.optim.Optimizer,
    clip_grad_norm: float | None,
    measure_norm: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One optimizer step over a window of micro-batches. Returns (mean loss, grad norm)."""
    micro_steps = len(window)
    losses: list[torch.Tensor] = []
    for i, batch in enumerate(window):
        # forward and backward both inside no_sync: DDP decides at backward whether to reduce
        with distributed.sync_context(model, sync=i == micro_steps - 1):
            with precision.autocast():
                loss = workload.loss(model, workload.prepare_batch(batch, train=True))
            # one micro-batch (the usual case): no division, no extra kernels
            precision.backward(loss if micro_steps == 1 else loss / micro_steps)
        losses.append(loss.detach())
    mean = losses[0].float() if micro_steps == 1 else torch.stack(losses).float().mean()
    norm_wanted = clip_grad_norm is not None or measure_norm
    params = [p for p in model.parameters() if p.grad is not None] if norm_wanted else []
    grad_norm = precision.step(optimizer, params, clip_grad_norm, measure_norm)
    optimizer.zero_grad(set_to_none=True)
    return mean, grad_norm


def cuda_graph_choice(recipe: Recipe, device: torch.device, streamed: bool) -> tuple[bool, str]:
    """Whether the steps are captured as a CUDA graph, by ``precision.cuda_graphs``: ``true``
    (its limits were checked when the recipe loaded), ``false``, or ``auto`` — when the recipe
    allows it (``cuda_graph_blocker``), the worker has a GPU and the training batches are
    gathered by the loop rather than streamed through a DataLoader (whose host-side decoding
    and copies a graph does not speed up). For ``auto`` without graphs, one line saying why."""
    setting = recipe.precision.cuda_graphs
    if setting != "auto":
        return setting == "true", ""
    blocker = cuda_graph_blocker(recipe)
    if blocker is None and device.type != "cuda":
        blocker = "needs GPU workers"
    if blocker is None and streamed:
        blocker = "needs batches gathered on the device, and the data streams through a DataLoader"
    if blocker is None:
        return True, ""
    return False, f"precision.cuda_graphs=auto: eager steps, as the graphed step {blocker}"


class Stepper:
    """One optimizer step over a window of micro-batches: ``stepper(window) -> (loss, norm)``.

    With ``cuda_graphs`` every step goes to the ``GraphedStep`` (one batch per window: graphs
    refuse accumulation): its first few eager, then a capture on a window's batch and replays;
    when the capture fails, ``note`` says why and that step and every later one are eager, on
    the graphed step's stream (the stream of the gradient accumulators). The loss is
    a device tensor (no host sync here); the gradient norm is one too, or None for an eager
    step that neither clips nor was asked to ``measure_norm``.
    """

    def __init__(
        self,
        model: nn.Module,
        workload: Workload,
        precision: Precision,
        optimizer: torch.optim.Optimizer,
        clip_grad_norm: float | None,
        cuda_graphs: bool,
        note: Callable[[str], None],
    ) -> None:
        self.model = model
        self.workload = workload
        self.precision = precision
        self.optimizer = optimizer
        self.clip_grad_norm = clip_grad_norm
        self.note = note
        self.graphed = (
            GraphedStep(model, workload, optimizer, clip_grad_norm, precision.autocast)
            if cuda_graphs
            else None
        )
        self.stream: Callable[[], contextlib.AbstractContextManager[None]] = contextlib.nullcontext

    def __call__(
        self, window: list[Batch], measure_norm: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.graphed is not None:
            stepped = self.graphed(window[0])
            if stepped is not None:
                return stepped
            self.note(f"CUDA graph capture failed, eager steps: {self.graphed.error}")
            # on the graphed step's stream still, the gradient accumulators' stream
            self.stream, self.graphed = self.graphed.on_side, None
        with self.stream():
            return optimizer_step(
                self.model, window, self.workload, self.precision, self.optimizer,
                self.clip_grad_norm, measure_norm,
            )  # fmt: skip
