"""The process group of Ray Train's workers, set up with torch imported only where it trains.

Ray Train's own ``TorchConfig`` lives in ``ray.train.torch``, which imports torch in every
process that holds or unpickles it: the command's driver and Ray Train's controller, neither of
which trains (~2.5 s each on a 2-core machine, one after the other before the first worker
starts). This config does for the workers what Ray's does for this runtime: rank 0's address
and a free port as the rendezvous, the torch.distributed environment variables, the process
group with the recipe's timeout (``scaling.timeout_s``), each worker's CUDA device, and the
group's end when the workers stop. The backend (nccl, gloo) is always named by the driver.

Relies on Ray Train's developer API (``ray.train.backend``) and on the worker group's
``execute``/``execute_single``/``execute_single_async``, as Ray's own backends do.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from ray.train.backend import Backend, BackendConfig

SHUTDOWN_TIMEOUT_S = 30.0
"""How long the workers' process groups get to end before Ray Train stops the workers anyway
(Ray's own default for its torch backend)."""


@dataclass
class ProcessGroupConfig(BackendConfig):
    backend: str = "gloo"
    timeout_s: int = 1800

    @property
    def backend_cls(self) -> type[Backend]:
        return _ProcessGroupBackend

    @property
    def train_func_context(self) -> type:
        return _WorkerDevice

    @property
    def framework(self) -> Any:
        """Named as torch in Ray's records of the run (its dashboard, its state export)."""
        from ray.train.v2._internal.util import TrainingFramework

        return TrainingFramework.TORCH

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "init_method": "env", "timeout_s": self.timeout_s}


class _ProcessGroupBackend(Backend):
    # As Ray's torch backend: the workers of a node see each other's GPUs (NCCL's P2P paths).
    share_cuda_visible_devices = True

    def on_start(self, worker_group: Any, backend_config: Any) -> None:
        import ray
        from ray.train._internal.utils import get_address_and_port

        address, port = worker_group.execute_single(0, get_address_and_port)
        worker_group.execute(_set_environment, address=address, port=port)
        size = len(worker_group)
        config = {"backend": backend_config.backend, "timeout_s": backend_config.timeout_s}
        starting = [
            worker_group.execute_single_async(
                rank, _start_process_group, world_rank=rank, world_size=size, **config
            )
            for rank in range(size)
        ]
        ray.get(starting)

    def on_shutdown(self, worker_group: Any, backend_config: Any) -> None:
        import ray
        from ray.exceptions import GetTimeoutError

        ending = worker_group.execute_async(_end_process_group, destroy=len(worker_group) > 1)
        # a hung collective: Ray Train stops the processes anyway
        with contextlib.suppress(GetTimeoutError):
            ray.get(ending, timeout=SHUTDOWN_TIMEOUT_S)


class _WorkerDevice:
    """Around the workers' loop: the current CUDA device is the worker's own GPU."""

    def __enter__(self) -> None:
        import torch

        if torch.cuda.is_available():
            import ray.train.torch

            device = ray.train.torch.get_device()
            if device.type == "cuda":
                torch.cuda.set_device(device)

    def __exit__(self, *exc: object) -> None:
        return None


def _set_environment(address: str, port: int) -> None:
    """On each worker: the rendezvous and the variables torch.distributed's tools read."""
    import ray.train

    context = ray.train.get_context()
    os.environ.update({
        "MASTER_ADDR": address,
        "MASTER_PORT": str(port),
        "RANK": str(context.get_world_rank()),
        "LOCAL_RANK": str(context.get_local_rank()),
        "WORLD_SIZE": str(context.get_world_size()),
        "LOCAL_WORLD_SIZE": str(context.get_local_world_size()),
        "NODE_RANK": str(context.get_node_rank()),
    })  # fmt: skip


def _start_process_group(backend: str, world_rank: int, world_size: int, timeout_s: int) -> None:
    import torch.distributed as dist

    if backend == "nccl" and not {
        "TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_BLOCKING_WAIT"
    } & set(os.environ):  # fmt: skip
        # a collective that times out fails the worker instead of hanging it
        os.environ["TORCH_NCCL_ASYNC_ERROR_HANDLING"] = "1"
    dist.init_process_group(
        backend=backend, init_method="env://", rank=world_rank, world_size=world_size,
        timeout=timedelta(seconds=timeout_s),
    )  # fmt: skip


def _end_process_group(destroy: bool) -> None:
    import torch
    import torch.distributed as dist

    if destroy and dist.is_initialized():
        dist.destroy_process_group()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()  # the next run on this GPU finds its memory free
