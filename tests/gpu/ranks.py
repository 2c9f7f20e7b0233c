"""Several processes on the GPUs of this host, one per GPU, in one NCCL process group: the
per-rank setup the GPU tests of DDP outside Ray share (test_gpu_step.py, test_sbi_gpu.py)."""

from __future__ import annotations

import socket
from collections.abc import Callable

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainforge.distributed import WorkerContext


def run_on_gpus(body: Callable[[WorkerContext], None], world: int = 2) -> None:
    """``body(ctx)`` in ``world`` spawned processes, rank r on cuda:r, inside an NCCL process
    group; an assertion that fails in any rank fails the caller (``start_processes`` raises).
    ``body`` must be a module-level function: spawned processes import it by name."""
    if torch.cuda.device_count() < world:
        pytest.skip(f"needs {world} GPUs")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.start_processes(_rank, (body, world, port), nprocs=world, start_method="spawn")


def _rank(rank: int, body: Callable[[WorkerContext], None], world: int, port: int) -> None:
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        device_id=device,
    )  # fmt: skip
    try:
        body(WorkerContext(rank, rank, world, 0, device))
    finally:
        dist.destroy_process_group()


def gather(tensor: torch.Tensor, world: int) -> list[torch.Tensor]:
    """Every rank's ``tensor`` (same shape on every rank), in rank order."""
    gathered = [torch.empty_like(tensor) for _ in range(world)]
    dist.all_gather(gathered, tensor)
    return gathered


def flat_parameters(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().flatten() for p in model.parameters()])
