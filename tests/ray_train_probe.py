"""A worker plugin (``TRAINFORGE_WORKER_PLUGINS=tests.ray_train_probe``) for a run on Ray Train's
workers: its loop fails unless the worker process began importing the run's modules at its
start (``worker/ray_train.preload``, a process set-up hook Ray Train does not pass on by
itself), and unless the worker stays where Ray started it, not in the new folder per run that
Ray Train would move it to (``ray_compat.trainer_class`` says why)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def install(trainer: Any, checkpointer: Any) -> None:
    from trainforge.worker import ray_train

    wanted = {"torch._dynamo"}  # DDP's constructor imports it, for several workers
    if not wanted <= set(ray_train.preloading):
        raise RuntimeError(f"this worker preloaded {ray_train.preloading}, not {sorted(wanted)}")
    here = Path.cwd()
    if here.parent.name == "artifacts":  # Ray Train's <session>/artifacts/<run name>
        raise RuntimeError(f"this worker was moved to Ray Train's folder of the run, {here}")
