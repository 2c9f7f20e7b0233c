"""The process group of Ray Train's workers, set up with torch imported only where it trains.

Ray Train's own ``TorchConfig`` lives in ``ray.train.torch``, which imports torch in every
process that holds or unpickles it: the command's driver and Ray Train's controller, neither of
which trains (~2.5 s each on a 2-core machine, one after the other before the first worker
starts). This config does for the workers what Ray's does for this runtime, through the one join
every worker path uses (``worker/process_group.py``): rank 0's address and a free port as the
rendezvous, the recipe's timeout, each worker's CUDA device, and the group's end when the
workers stop. The backend (nccl, gloo) is always named by the driver. The controller unpickles
this module's config: it imports nothing beyond Ray Train's backend API and the workers' side.

Relies on Ray Train's developer API (``ray.train.backend``) and on the worker group's
``execute``/``execute_single``/``execute_single_async``, as Ray's own backends do.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from ray.train.backend import Backend, BackendConfig

from trainforge.worker import ray_train as on_workers

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
        return on_workers.OnWorkerDevice

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
        config = {"backend": backend_config.backend, "timeout_s": backend_config.timeout_s}
        joining = [
            worker_group.execute_single_async(
                rank, on_workers.join_group, address=address, port=port, **config
            )
            for rank in range(len(worker_group))
        ]
        ray.get(joining)

    def on_shutdown(self, worker_group: Any, backend_config: Any) -> None:
        import ray
        from ray.exceptions import GetTimeoutError

        ending = worker_group.execute_async(on_workers.leave_group)
        # a hung collective: Ray Train stops the processes anyway
        with contextlib.suppress(GetTimeoutError):
            ray.get(ending, timeout=SHUTDOWN_TIMEOUT_S)
