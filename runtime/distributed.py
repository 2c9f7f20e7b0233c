"""Who am I in the worker group, and the few collectives the loop needs.

Ray Train has already created the process group (nccl on GPU, gloo on CPU) when a worker's
loop starts; these helpers also work without one (world size 1, plain tests).
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from trainforge.gradient_averaging import AveragedModule

# DDP's switch for "no broadcast of buffers before every forward": torch 2.13 renames
# broadcast_buffers to forward_sync_buffers (and warns on the old name); earlier releases
# (the GPU machines' 2.11) have only the old one.
NO_FORWARD_BUFFER_SYNC: dict[str, Any] = (
    {"forward_sync_buffers": False}
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    else {"broadcast_buffers": False}
)

BUCKET_CAP_MB: float = 25.0
"""DDP's gradient bucket size for eager steps (its default): each bucket's all-reduce starts as
soon as the backward pass has produced its gradients. Graphed steps average their gradients
without DDP (``gradient_averaging.py``, its own bucket size)."""


@dataclass(frozen=True)
class WorkerContext:
    rank: int
    local_rank: int
    world_size: int
    node_rank: int
    device: torch.device
    node_id: str = ""
    """Ray's node id (two raylets on one host share a node_rank, which Ray derives from the IP)."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def ray_context() -> WorkerContext:
    """The context of a Ray Train worker."""
    import ray
    import ray.train
    import ray.train.torch

    ctx = ray.train.get_context()
    return WorkerContext(
        rank=ctx.get_world_rank(),
        local_rank=ctx.get_local_rank(),
        world_size=ctx.get_world_size(),
        node_rank=ctx.get_node_rank(),
        device=ray.train.torch.get_device(),
        node_id=ray.get_runtime_context().get_node_id(),
    )


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def several_ranks() -> bool:
    """Whether there is anyone to exchange with. A lone rank makes no collective call: on NCCL
    the first one would create a communicator (most of a second) to talk to nobody."""
    return is_initialized() and dist.get_world_size() > 1


def wrap(
    model: nn.Module,
    ctx: WorkerContext,
    cuda_graphs: bool = False,
    gradient_as_bucket_view: bool = True,
) -> nn.Module:
    """DDP when there is more than one rank; the bare module otherwise (no wrapper, no no_sync).
    A step captured as a CUDA graph on several GPUs runs an ``AveragedModule`` instead, its
    gradients averaged by hooks of its own (``gradient_averaging.py``: no copy of each gradient
    into a bucket, as DDP makes; ~0.5% of a graphed 2-GPU ResNet-18 step).

    Gradients are views into DDP's all-reduce buckets: no copy into the bucket before the
    all-reduce and none back after it (for small SBI flows those copies are dozens of tiny
    kernels per step).

    Buffers (BatchNorm's running statistics, an SBI flow's z-scoring constants) are made equal
    to rank 0's here, and not broadcast again before every forward as DDP does by default: a
    training forward does not read running statistics, so the weights train exactly as with
    the broadcast, and one collective fewer per step was 2% of a graphed ResNet-18 step on 4
    H100s. Each rank's running statistics then follow its own
    batches; ``broadcast_buffers`` makes them rank 0's again where they are read (evaluation),
    and checkpoints save rank 0's."""
    if ctx.world_size == 1:
        return model
    if cuda_graphs and ctx.device.type == "cuda":
        return AveragedModule(model)  # rank 0's parameters and buffers
    broadcast_buffers(model)
    # DDP broadcasts rank 0's parameters here, so every rank starts identical.
    return DistributedDataParallel(
        model,
        device_ids=[ctx.device.index] if ctx.device.type == "cuda" else None,
        **NO_FORWARD_BUFFER_SYNC,
        gradient_as_bucket_view=gradient_as_bucket_view,
        bucket_cap_mb=BUCKET_CAP_MB,
    )


_step_streams: dict[torch.device, torch.cuda.Stream] = {}


def step_stream(device: torch.device) -> torch.cuda.Stream:
    """The side stream of a graphed step's eager steps on ``device`` (``worker.step.GraphedStep``):
    their backward passes make the parameters' gradient accumulators, which keep this stream;
    an eager step on another stream than theirs may sync the two streams per parameter (torch
    warns so, once per process: "The AccumulateGrad node's stream does not match … may incur
    unnecessary synchronization"). The capture does run on another stream, on purpose:
    ``worker.step`` says why."""
    if device not in _step_streams:
        _step_streams[device] = torch.cuda.Stream(device)
    return _step_streams[device]


@contextlib.contextmanager
def on_step_stream(device: torch.device) -> Iterator[None]:
    """Work on ``step_stream(device)``, ordered after the work queued before it and before
    whatever is queued after it."""
    side, current = step_stream(device), torch.cuda.current_stream(device)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        yield
    current.wait_stream(side)


def broadcast_buffers(module: nn.Module) -> None:
    """Rank 0's buffers on every rank (a no-op without a process group); all ranks call it."""
    if not is_initialized() or dist.get_world_size() == 1:
        return
    with torch.no_grad():
        for buffer in unwrap(module).buffers():
            dist.broadcast(buffer, src=0)


def sync_context(model: nn.Module, sync: bool) -> contextlib.AbstractContextManager[Any]:
    """Skip DDP's gradient all-reduce on non-final micro-steps of an accumulation window."""
    if sync or not isinstance(model, DistributedDataParallel):
        return contextlib.nullcontext()
    return model.no_sync()


def unwrap(model: nn.Module) -> nn.Module:
    model = getattr(model, "_orig_mod", model)  # torch.compile
    if isinstance(model, (DistributedDataParallel, AveragedModule)):
        return model.module
    return model


def all_reduce_sums(
    values: dict[str, torch.Tensor | float], device: torch.device
) -> dict[str, torch.Tensor]:
    """Sum each value (scalar or tensor) over ranks in one collective and one host sync;
    returns float64 CPU tensors of the original shapes."""
    keys = sorted(values)
    tensors = [torch.as_tensor(values[k], dtype=torch.float64, device=device) for k in keys]
    packed = torch.cat([t.reshape(-1) for t in tensors])
    if several_ranks():
        dist.all_reduce(packed, op=dist.ReduceOp.SUM)
    packed = packed.cpu()
    out, offset = {}, 0
    for key, tensor in zip(keys, tensors, strict=True):
        out[key] = packed[offset : offset + tensor.numel()].reshape(tensor.shape)
        offset += tensor.numel()
    return out


def all_gather_objects(obj: Any, world_size: int) -> list[Any]:
    if not is_initialized() or world_size == 1:
        return [obj]
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, obj)
    return gathered


@contextlib.contextmanager
def main_first(ctx: WorkerContext) -> Iterator[None]:
    """Let rank 0 do something first (e.g. fill a cache) while the others wait."""
    if not ctx.is_main and several_ranks():
        barrier(ctx)
    yield
    if ctx.is_main and several_ranks():
        barrier(ctx)


def barrier(ctx: WorkerContext) -> None:
    """A barrier of all ranks on this rank's GPU. Ray Train's process group is made without a
    device (``init_process_group(device_id=…)``), and there NCCL's barrier otherwise takes the
    current device and warns so on rank 0 ("barrier(): using the device under current
    context"), a line in every multi-GPU run's console on a Ray cluster."""
    on_gpu = ctx.device.type == "cuda" and ctx.device.index is not None
    dist.barrier(device_ids=[ctx.device.index] if on_gpu else None)
