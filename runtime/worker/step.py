"""The optimizer step: eager (``optimizer_step``: micro-batches with DDP's ``no_sync`` on all
but the last, unscale, clip, step), or the whole step — forward, backward, gradient clipping,
optimizer update — captured once as a CUDA graph and replayed for every batch (``GraphedStep``).
``Stepper`` is what the loop calls: it chooses between the two, capturing at its first call
(capture needs a real batch) and going on with eager steps when capture fails.

Why: the SBI estimators (tens of thousands of parameters, dozens of small layers) are bound by
kernel launches and Python, not arithmetic: an eager step of sbi's MAF costs ~9 ms on an H200
whatever the batch. Replaying a graph is one launch per step.

How (PyTorch's "whole-network capture"): every tensor of the batch is copied into a static
tensor of its own; the optimizer is capturable with its learning rate in a device tensor (so the
LR schedule still applies, through ``fill_``); gradients are created inside the graph (set to
None before capture), so each replay writes fresh gradients instead of accumulating. Warm-up
steps on a side stream must run before capture; they would change the weights, so the model and
optimizer state are put back afterwards and training starts exactly where it would have without
graphs.

With DDP (several GPU workers) the gradient all-reduce is captured too (NCCL allows collectives
in a graph). As PyTorch's CUDA notes ask, DDP is constructed on a side stream
(``distributed.wrap``) and runs at least 11 eager iterations before capture (DDP finishes
setting up its buckets and logging in the first ten). The notes also ask for NCCL's
asynchronous error handling off; capture and replay work with Ray Train's default
(``TORCH_NCCL_ASYNC_ERROR_HANDLING=1``, tested on H200s), so nothing sets it.

Every optimizer: Adam and AdamW capturable (step counter and LR on the device), SGD fused with
its LR in a device tensor (``optim.build_optimizer``). BatchNorm's running statistics and the
GPU-side augmentation run inside the graph: the running statistics are buffers updated in
place; the augmentation's random numbers come from the device generator, which a replay
advances by what the captured step draws, as an eager step would. The warm-up's draws are
undone too (``Snapshot``), so a graphed run crops and flips exactly as the eager run would.

Limits: GPU workers, no gradient accumulation (one fixed step per graph), no fp16 (its
GradScaler decides on the host whether to step), no ``precision.compile``, and every training
batch the same shape (the loop drops partial batches anyway). ``precision.cuda_graphs: true``
refuses a recipe outside them when it is loaded; ``auto`` takes eager steps and says why in
one line (``cuda_graph_choice``), also when the training data streams through a DataLoader.
"""

from __future__ import annotations

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


class GraphedStep:
    def __init__(
        self,
        model: nn.Module,
        workload: Any,
        optimizer: torch.optim.Optimizer,
        clip_grad_norm: float | None,
        example: Batch,
        autocast: Any,
    ) -> None:
        # the graph reads its batch from these tensors' addresses: __call__ copies into them
        self.batch = tuple(t.detach().clone() for t in example)
        self.params = [p for p in model.parameters() if p.requires_grad]
        max_norm = clip_grad_norm if clip_grad_norm is not None else float("inf")

        def body() -> tuple[torch.Tensor, torch.Tensor]:
            with autocast():
                loss = workload.loss(model, workload.prepare_batch(self.batch, True))
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(self.params, max_norm, foreach=True)
            optimizer.step()
            return loss.detach().float(), norm

        snapshot = Snapshot(model, optimizer)
        ddp = isinstance(model, DistributedDataParallel)  # never compiled: refused with graphs
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(DDP_WARMUP_STEPS if ddp else WARMUP_STEPS):
                optimizer.zero_grad(set_to_none=True)
                body()
        torch.cuda.current_stream().wait_stream(side)

        self.graph: torch.cuda.CUDAGraph | None = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        try:
            with torch.cuda.graph(self.graph):
                self.loss, self.norm = body()
        except RuntimeError as exc:
            # Data-dependent control flow (e.g. nflows' spline domain checks) cannot be
            # captured: the caller goes on with eager steps.
            self.graph, self.error = None, " ".join(str(exc).split())[:200]
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            _end_generator_capture(snapshot.device)
        snapshot.restore()  # in place: the graph holds these tensors' addresses

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def __call__(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step on this batch: (loss, pre-clip gradient norm), both fresh tensors."""
        assert self.graph is not None, "replaying a step whose capture failed"
        for static, tensor in zip(self.batch, batch, strict=True):
            static.copy_(tensor)
        self.graph.replay()
        return self.loss.clone(), self.norm.clone()


class Snapshot:
    """What the warm-up steps before capture change, to put back after it: the model's weights
    and buffers (BatchNorm's running statistics and batch counts), the optimizer's state and
    the random stream of the parameters' device (augmentation draws from it).

    Put back in place, since the graph holds these tensors' addresses. Optimizer state that the
    warm-up created is zeroed: what a first step starts from — Adam's step 0 and zero moments;
    SGD's momentum buffer, which its first step sets to the gradient and a later step to
    ``momentum × 0 + gradient`` (no dampening: ``build_optimizer`` never sets one)."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        self.weights = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.state = _clone_state(optimizer)
        self.device = next(model.parameters()).device
        self.rng = _rng_state(self.device)

    def restore(self) -> None:
        with torch.no_grad():
            for key, value in self.model.state_dict().items():
                value.copy_(self.weights[key])
            _restore_state(self.optimizer, self.state)
        if self.device.type == "cuda":
            torch.cuda.set_rng_state(self.rng, self.device)
        else:
            torch.set_rng_state(self.rng)


def _end_generator_capture(device: torch.device) -> None:
    """A capture that fails never reaches its end, where the device's random generator leaves
    capture mode: every later draw on the device would fail ("Offset increment outside graph
    capture encountered unexpectedly"), such as the posterior's samples after training. A
    capture that succeeds, of one small op, starts and ends that mode again."""
    scratch = torch.zeros(1, device=device)
    with torch.cuda.graph(torch.cuda.CUDAGraph()):
        scratch.add_(1)
    torch.cuda.synchronize(device)


def _rng_state(device: torch.device) -> torch.Tensor:
    if device.type == "cuda":
        return torch.cuda.get_rng_state(device)
    return torch.get_rng_state()


def _clone_state(optimizer: torch.optim.Optimizer) -> dict[int, dict[str, Any]]:
    return {
        id(p): {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in state.items()}
        for p, state in optimizer.state.items()
    }


def _restore_state(optimizer: torch.optim.Optimizer, saved: dict[int, dict[str, Any]]) -> None:
    """Back to the saved optimizer state; state the warm-up created is reset to zeros."""
    for param, state in optimizer.state.items():
        before = saved.get(id(param), {})
        for key, value in state.items():
            if not torch.is_tensor(value):
                continue
            if key in before:
                value.copy_(before[key])
            else:
                value.zero_()


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

    With ``cuda_graphs`` the first call captures the step as a CUDA graph on the window's first
    batch and every call replays it (one batch per window: graphs refuse accumulation); when
    capture fails, ``note`` says why and the steps stay eager. The loss is a device tensor (no
    host sync here); the gradient norm is one too, or None for an eager step that neither clips
    nor was asked to ``measure_norm``.
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
        self.capture_pending = cuda_graphs
        self.note = note
        self.graphed: GraphedStep | None = None

    def __call__(
        self, window: list[Batch], measure_norm: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.capture_pending:
            self.capture_pending = False
            self.graphed = self._capture(window[0])
        if self.graphed is not None:
            return self.graphed(window[0])
        return optimizer_step(
            self.model, window, self.workload, self.precision, self.optimizer,
            self.clip_grad_norm, measure_norm,
        )  # fmt: skip

    def _capture(self, example: Batch) -> GraphedStep | None:
        graphed = GraphedStep(
            self.model, self.workload, self.optimizer, self.clip_grad_norm, example,
            self.precision.autocast,
        )  # fmt: skip
        if graphed.captured:
            return graphed
        self.note(f"CUDA graph capture failed, eager steps: {graphed.error}")
        return None
