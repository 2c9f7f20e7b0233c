"""What Ray Train's workers run: joining and leaving the process group (the driver's backend,
``driver/workers/ray_train.py``, calls these on every worker) and the loop. Imported only in
Ray Train's workers; torch where it trains, never at this module's import (the driver names
these functions without importing torch)."""

from __future__ import annotations

import importlib
import threading
from typing import Any

from trainforge import log, settings
from trainforge.worker import environment
from trainforge.worker.payload import WorkerPayload

preloading: tuple[str, ...] = ()
"""What ``preload`` began importing in this process (empty where it did not run)."""


def preload() -> None:
    """Ray Train's workers' process set-up hook: what the run imports beyond torch and the loop
    (``settings.PRELOAD``: dynamo for DDP, the workload's modules) imported on a thread from
    the process's start, beside Ray Train's set-up of the group (its other actors, the
    rendezvous), as a command's own workers import them before their run. The loop's own
    imports find them done, or wait for them."""
    global preloading
    preloading = settings.preload()
    threading.Thread(target=_import_all, args=(preloading,), name="trainforge-preload",
                     daemon=True).start()  # fmt: skip


def _import_all(modules: tuple[str, ...]) -> None:
    for module in modules:
        try:
            importlib.import_module(module)
        except Exception:  # the loop's own import of it says what is wrong
            return


def join_group(backend: str, address: str, port: int, timeout_s: float) -> None:
    """The process group, through the one join every worker path uses."""
    import ray.train

    from trainforge.worker import process_group

    context = ray.train.get_context()
    place = process_group.Place(
        context.get_world_rank(), context.get_world_size(), context.get_local_rank(),
        context.get_local_world_size(), context.get_node_rank(),
    )  # fmt: skip
    device = None
    if backend == "nccl":
        import ray.train.torch

        device = ray.train.torch.get_device()
    process_group.join(backend, place, (address, port), timeout_s, device)


def leave_group() -> None:
    from trainforge.worker import process_group

    process_group.leave()


class OnWorkerDevice:
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


def entry(config: dict[str, Any]) -> None:
    """Each Ray Train worker's loop (``train_loop_per_worker``)."""
    import ray.train

    from trainforge import distributed
    from trainforge.checkpoint import RayReporter

    payload: WorkerPayload = config["payload"]
    environment.apply(payload.env)
    context = ray.train.get_context()
    if context.get_world_rank() == 0:
        size = context.get_world_size()
        log.phase("workers", f"{size} started, process group up", payload.requested_at)
    # imported here (begun by ``preload``): the driver does not pay for the loop's imports
    from trainforge.worker.trainer import run

    run(payload, distributed.ray_context(), RayReporter())
