"""A worker out of memory, told in one line: what each worker holds and what to change.

``torch.OutOfMemoryError`` raised in any worker (the CUDA caching allocator's) ends the run like
any worker failure; instead of the worker's traceback the command prints the per-worker batch,
the accumulation and a hint, and exits 1. Checkpoints are untouched (nothing is saved after a
failed step), so the same command resumes once the recipe fits. ``TRAINFORGE_OOM_AT_STEP=N``
makes the last rank raise it during step N (``worker/faults.py``): how the tests produce one
on a CPU.
"""

from __future__ import annotations

from trainforge import ray_compat
from trainforge.config import Recipe


def explain(exc: BaseException, cfg: Recipe) -> str | None:
    """One line when a worker ran out of memory behind a failed ``fit()``, else None."""
    import torch

    failures = ray_compat.worker_failures(exc)
    ranks = [rank for rank, error in failures.items() if isinstance(error, torch.OutOfMemoryError)]
    if not ranks:
        return None
    train, workers = cfg.train, cfg.scaling.num_workers
    device = "GPU" if cfg.scaling.use_gpu == "true" else "CPU"
    return (
        f"out of {device} memory on rank {', '.join(map(str, ranks))}: each of {workers} "
        f"workers runs train.batch_size {train.batch_size} samples at a time, "
        f"train.grad_accum_steps {train.grad_accum_steps} times per step (global batch "
        f"{train.batch_size * train.grad_accum_steps * workers}); lower train.batch_size and "
        "raise train.grad_accum_steps by the same factor (same global batch), or use "
        "precision.dtype=bf16; the same command then resumes from the last checkpoint"
    )
