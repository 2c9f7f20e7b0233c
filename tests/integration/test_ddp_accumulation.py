"""Gradient accumulation under real DDP (2 processes, gloo): only the last micro-step of a
window all-reduces, and the ranks end with identical parameters."""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from trainforge.distributed import WorkerContext
from trainforge.precision import Precision
from trainforge.worker.step import optimizer_step
from trainforge.workloads.cnn.config import CNNWorkloadConfig
from trainforge.workloads.cnn.workload import CNNWorkload


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _worker(rank: int, port: int, results: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        from trainforge.workloads.cnn.models import SimpleCNN

        torch.manual_seed(0)
        model = DistributedDataParallel(SimpleCNN(1, 10, 32))
        calls = {"n": 0}

        def counting_hook(state, bucket):  # counts every bucket all-reduce DDP launches
            calls["n"] += 1
            return allreduce_hook(state, bucket)

        model.register_comm_hook(dist.group.WORLD, counting_hook)
        workload = CNNWorkload(CNNWorkloadConfig(), seed=0)  # no augmentation or smoothing
        precision = Precision("fp32", torch.device("cpu"))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        gen = torch.Generator().manual_seed(rank)

        def batch():
            return torch.randn(4, 1, 32, 32, generator=gen), torch.randint(
                0, 10, (4,), generator=gen
            )

        counts = []
        for window_size in (1, 3, 4):
            before = calls["n"]
            window = [batch() for _ in range(window_size)]
            optimizer_step(model, window, workload, precision, optimizer, clip_grad_norm=1.0)
            counts.append(calls["n"] - before)
        flat = torch.cat([p.detach().flatten() for p in model.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(2)]
        dist.all_gather(gathered, flat)
        results[rank] = {"counts": counts, "same": torch.equal(gathered[0], gathered[1])}
    finally:
        dist.destroy_process_group()


def test_only_the_last_micro_step_all_reduces() -> None:
    manager = mp.Manager()
    results = manager.dict()
    mp.spawn(_worker, args=(_free_port(), results), nprocs=2, join=True)
    for rank in (0, 1):
        counts = results[rank]["counts"]
        # A window of 3 or 4 micro-steps launches exactly the all-reduces of one backward pass.
        assert counts[0] > 0
        assert counts == [counts[0]] * 3, counts
        assert results[rank]["same"], "ranks diverged"


def test_world_size_one_has_no_ddp_wrapper() -> None:
    from trainforge.distributed import sync_context, wrap
    from trainforge.workloads.cnn.models import SimpleCNN

    ctx = WorkerContext(rank=0, local_rank=0, world_size=1, node_rank=0, device=torch.device("cpu"))
    model = SimpleCNN(1, 10, 32)
    assert wrap(model, ctx) is model
    with sync_context(model, sync=False):  # must not need .no_sync()
        pass
