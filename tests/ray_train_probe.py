"""A worker plugin (``TRAINFORGE_WORKER_PLUGINS=tests.preload_probe``) for a run on Ray Train's
workers: its loop fails unless the worker process began importing the run's modules at its
start (``worker/ray_train.preload``, a process set-up hook Ray Train does not pass on by
itself)."""

from __future__ import annotations

from typing import Any


def install(trainer: Any, checkpointer: Any) -> None:
    from trainforge.worker import ray_train

    wanted = {"torch._dynamo"}  # DDP's constructor imports it, for several workers
    if not wanted <= set(ray_train.preloading):
        raise RuntimeError(f"this worker preloaded {ray_train.preloading}, not {sorted(wanted)}")
