"""A worker that stopped responding in a collective, told in one line.

Every optimizer step ends in an all-reduce that waits for every rank. When one rank stops (a
deadlock, a stuck data loader, a wedged device), the others wait for it until the process
group's timeout — ``scaling.timeout_s``, given to Ray Train's ``TorchConfig`` — ends the wait
with an error in the waiting ranks; Ray Train then stops the whole worker group, the stuck
worker included. Instead of gloo's traceback the command says what happened and which setting
decides it, and exits 1; the checkpoints are untouched, so the same command resumes.
``TRAINFORGE_HANG_AT_STEP=N`` makes the last rank stop before step N (``worker/faults.py``):
how the tests produce one on a CPU.
"""

from __future__ import annotations

import re

from trainforge import ray_compat
from trainforge.config import Recipe

# gloo's words when a collective's wait ends ("Timed out waiting 5000ms for recv operation to
# complete"), and NCCL's watchdog's when it reports one instead of ending the process
TIMED_OUT = re.compile(r"Timed out waiting \d+ ?ms for \w+ operation|collective operation timeout")


def explain(exc: BaseException, cfg: Recipe) -> str | None:
    """One line when workers timed out waiting in a collective behind a failed ``fit()``,
    else None."""
    failures = ray_compat.worker_failures(exc)
    ranks = [
        rank
        for rank, error in failures.items()
        if isinstance(error, RuntimeError) and TIMED_OUT.search(str(error))
    ]
    if not ranks:
        return None
    timeout = cfg.scaling.timeout_s
    return (
        f"rank {', '.join(map(str, ranks))} waited scaling.timeout_s={timeout} s in a "
        "collective for a worker that stopped responding (a deadlock, a stuck data loader or "
        "device); all workers were stopped. If a worker is only slow at times (a long "
        "evaluation or checkpoint on one rank), raise scaling.timeout_s; the same command "
        "resumes from the last checkpoint"
    )
