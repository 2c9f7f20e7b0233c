"""The one way a worker joins its run's process group, whichever path started it: the command's
own processes and warm workers (rank 0's TCP store on loopback) and Ray Train's workers (rank
0's address on its node) all come here, with the same backend options, timeout and NCCL
settings, and leave the same way."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class Place:
    """Where a worker stands in the group (what torchrun and Ray Train tell a worker)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int = 0

    @classmethod
    def on_one_machine(cls, rank: int, world_size: int) -> Place:
        return cls(rank, world_size, rank, world_size, 0)

    def env(self) -> dict[str, str]:
        """The variables torch.distributed's tools read, which code in the loop may read too
        (the SBI workload sizes its host memory by LOCAL_WORLD_SIZE)."""
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size),
                "LOCAL_RANK": str(self.local_rank),
                "LOCAL_WORLD_SIZE": str(self.local_world_size),
                "NODE_RANK": str(self.node_rank)}  # fmt: skip


def join(
    backend: str,
    place: Place,
    master: tuple[str, int],
    timeout_s: float,
    device: torch.device | None = None,
) -> None:
    """Join the group whose rank 0 listens at ``master`` (address, port). On NCCL a collective
    that times out fails the worker instead of hanging it, and, with ``device`` and ranks to
    talk to, the communicator is made here, not at the first collective. A lone rank makes no
    collective call (``distributed.several_ranks``), so its group never makes one."""
    import torch.distributed as dist

    address, port = master
    os.environ.update(place.env() | {"MASTER_ADDR": address, "MASTER_PORT": str(port)})
    if backend == "nccl" and not {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT"
    } & set(os.environ):  # fmt: skip
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    timeout = timedelta(seconds=timeout_s)
    store = dist.TCPStore(address, port, place.world_size, is_master=place.rank == 0,
                          timeout=timeout)  # fmt: skip
    eager = device if backend == "nccl" and place.world_size > 1 else None
    dist.init_process_group(backend, store=store, rank=place.rank,
                            world_size=place.world_size, timeout=timeout,
                            device_id=eager)  # fmt: skip


def leave() -> None:
    """Leave the group, and give the GPU's cached memory back to the next run on it."""
    import torch
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
