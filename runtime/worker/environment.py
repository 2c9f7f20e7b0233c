"""The command's environment in a worker (``driver/local_cluster.worker_env`` collects it).

A worker of the lasting local cluster is a child of a Ray started by an earlier command, and a
warm worker (``worker/warm.py``) serves one command after another: neither inherited this
command's environment. The driver sends its settings (thread counts, MLflow, trainforge's own
switches, the Python path) and the worker takes them on here.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator, Mapping

GPU_WORKER_ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
"""A GPU worker's environment before its CUDA context exists (CUDA reads it then). One hardware
work queue per GPU instead of 8: the gradient all-reduce that DDP launches on NCCL's stream
during the backward pass then starts in the order it was launched, between the backward
kernels, instead of waiting behind them in a queue of its own. 4×H200, graphed ResNet-18 at
batch 256: weak scaling 0.938 → 0.956; one GPU and eager steps unchanged."""


def gpu_worker_env(env: Mapping[str, str]) -> dict[str, str]:
    """``GPU_WORKER_ENV``, where ``env`` (the user's) sets none of it: a value given is kept."""
    return {key: env.get(key, value) for key, value in GPU_WORKER_ENV.items()}


PROCESS_OWN = frozenset({
    "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES",  # its devices
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "NODE_RANK", "GROUP_RANK",
    "MASTER_ADDR", "MASTER_PORT",  # its place in a process group
    "PWD", "OLDPWD", "SHLVL", "_",  # a shell's bookkeeping of the process it started
})  # fmt: skip


def own(key: str) -> bool:
    """A variable that belongs to each process, never taken from the command: ``PROCESS_OWN``,
    and Ray's settings of that process (``RAY_*``, the cluster's address among them)."""
    return key in PROCESS_OWN or key.startswith("RAY_")


def apply(env: dict[str, str]) -> None:
    """Take on the command's settings. The worker may have been started by Ray before the
    command, with torch already imported: its thread count is set through torch, the Python
    path extended in place. What the worker has and the command lacks stays: Ray and Ray Train
    set some of it for the process (its thread count, NCCL's error handling). Only the values
    that differ are set: a simulation task takes its command's environment on at each call."""
    os.environ.update({key: value for key, value in env.items() if os.environ.get(key) != value})
    for entry in reversed(env.get("PYTHONPATH", "").split(os.pathsep)):
        if entry and entry not in sys.path:
            sys.path.insert(0, entry)
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and "torch" in sys.modules:
        import torch

        torch.set_num_threads(int(threads))


@contextlib.contextmanager
def applied(env: dict[str, str]) -> Iterator[None]:
    """The command's settings while it is served; the process's own environment afterwards
    (a warm worker's next command must not see this one's credentials or switches)."""
    saved = dict(os.environ)
    apply(env)
    try:
        yield
    finally:
        _restore(saved)


def _restore(saved: dict[str, str]) -> None:
    """``os.environ`` as ``saved`` again, changing only what differs: clearing and refilling it
    cost ~0.2 ms a call (34 variables), at every task of a simulation stage."""
    now = dict(os.environ)
    for key in now.keys() - saved.keys():
        del os.environ[key]
    os.environ.update({key: value for key, value in saved.items() if now.get(key) != value})
