"""A worker that stopped responding while the others waited for it, told in one line.

Every optimizer step ends in an all-reduce that waits for every rank, and every checkpoint in
``ray.train.report``, a barrier of Ray Train's own. When one rank stops (a deadlock, a stuck
data loader, a wedged device, storage that does not answer), the others wait for it until
``scaling.timeout_s`` ends the wait with an error in the waiting ranks: the process group's
timeout (given to Ray Train's ``TorchConfig``) for the all-reduce, and Ray Train's collective
timeout (``ray_compat.time_out_report_barriers``; without it the barrier waits forever) for the
report. Ray Train then stops the whole worker group, the stuck worker included. Instead of the
worker's traceback the command says what happened and which setting decides it, and exits 1;
the checkpoints are untouched, so the same command resumes. ``TRAINFORGE_HANG_AT_STEP=N`` and
``TRAINFORGE_HANG_AT_REPORT=N`` make the last rank stop before step N or before the report of
step N's checkpoint (``worker/faults.py``): how the tests produce both on a CPU.
"""

from __future__ import annotations

import re

from trainforge import ray_compat
from trainforge.config import Recipe
from trainforge.errors import CollectiveFailed

# gloo's words when a collective's wait ends ("Timed out waiting 5000ms for recv operation to
# complete"), and NCCL's watchdog's when it reports one instead of ending the process
TIMED_OUT = re.compile(r"Timed out waiting \d+ ?ms for \w+ operation|collective operation timeout")


def explain(exc: BaseException, cfg: Recipe) -> str | None:
    """One line when workers gave up waiting for another rank behind a failed ``fit()``,
    else None."""
    failures = ray_compat.worker_failures(exc)
    timeout = f"scaling.timeout_s={cfg.scaling.timeout_s} s"
    in_collective = [
        rank
        for rank, error in failures.items()
        if isinstance(error, CollectiveFailed)
        or (isinstance(error, RuntimeError) and TIMED_OUT.search(str(error)))
    ]
    at_report = {rank: ray_compat.report_timeout_ranks(error) for rank, error in failures.items()}
    missing = sorted({m for ranks in at_report.values() for m in ranks or []})
    if in_collective:
        what = f"rank {_ranks(in_collective)} waited {timeout} in a collective for a worker"
    elif missing:
        waited = [rank for rank, ranks in at_report.items() if ranks is not None]
        what = (
            f"rank {_ranks(waited)} waited {timeout} at a checkpoint report (ray.train.report) "
            f"for rank {_ranks(missing)}, a worker"
        )
    else:
        return None
    return (
        f"{what} that stopped responding (a deadlock, a stuck data loader, device or storage); "
        "all workers were stopped. If a worker is only slow at times (a long evaluation or "
        "checkpoint on one rank), raise scaling.timeout_s; the same command resumes from the "
        "last checkpoint"
    )


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, ranks))
