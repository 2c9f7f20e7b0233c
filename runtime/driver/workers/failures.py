"""A failed run told in one line: what happened, where the run stands and what to change, instead
of a worker's traceback. The same words on every worker path: each group hands its failed ranks'
errors over as they were raised in the workers (``base.Failures``).

- **Out of memory** (``torch.OutOfMemoryError``, the CUDA caching allocator's): what each worker
  holds and how to hold less at the same global batch. Nothing is saved after a failed step, so
  the same command resumes once the recipe fits.
- **A rank that stopped responding** while the others waited for it: in a collective (the
  process group's ``scaling.timeout_s``) or at a checkpoint report (Ray Train's barrier, given
  the same timeout: ``ray_compat.time_out_report_barriers``). Every worker is stopped; the
  checkpoints are untouched.
- **A full disk** (ENOSPC) while a checkpoint was written: the path and the run's latest valid
  checkpoint. Checkpoint files are written under temporary names and sealed by a manifest, so
  nothing half-written is taken as the latest.
- **A worker process that died** (the OOM killer, a kill -9, a crash in native code).

The tests cause each of these on a CPU through a worker plugin (``tests/faults.py``).
"""

from __future__ import annotations

import errno
import json
import re

from trainforge import log, ray_compat, storage
from trainforge.config import Recipe
from trainforge.driver.workers.base import (
    Failures,
    WorkerDied,
    WorkersFailed,
    cause,
    first_failed,
)
from trainforge.errors import CollectiveFailed, NonFiniteLoss
from trainforge.log import first_line

RESUMES = "the same command resumes from the last checkpoint"


def said(exc: WorkersFailed, cfg: Recipe, run_dir: str) -> str:
    """Say how the run failed, in one line where this module knows the failure (the run's own
    stop on a NaN loss among them), else with the worker's error; returns the reason the MLflow
    run records."""
    errors = [cause(error) for error in exc.worker_failures.values()]
    stopped = [error for error in errors if isinstance(error, NonFiniteLoss)]
    if stopped:  # the run's own verdict: nothing to resume
        reason = f"{first_line(stopped[0], limit=1000)}. Try {_steadier(cfg)}"
        log.error(f"training stopped: {reason}")
        return reason
    explained = explain(exc.worker_failures, cfg, run_dir)
    if explained is not None:
        log.error(f"training failed: {explained}")
        return explained
    log.error(f"training failed: {exc}")
    log.error(f"re-run with run.name={cfg.run.name} to resume")
    failures = exc.worker_failures
    first = cause(failures[first_failed(failures)]) if failures else exc
    return f"{type(first).__name__}: {first_line(first, limit=1000)}"


def explain(failures: Failures, cfg: Recipe, run_dir: str) -> str | None:
    """One line for a failure this module knows, else None (the worker's error is shown)."""
    errors = {rank: cause(error) for rank, error in failures.items()}
    return (
        out_of_memory(errors, cfg)
        or timed_out(errors, cfg)
        or disk_full(errors, run_dir)
        or worker_died(errors)
    )


def out_of_memory(failures: Failures, cfg: Recipe) -> str | None:
    ranks = [rank for rank, error in failures.items() if _is_a(error, "OutOfMemoryError")]
    if not ranks:
        return None
    train, workers = cfg.train, cfg.scaling.num_workers
    device = "GPU" if cfg.scaling.use_gpu == "true" else "CPU"
    return (
        f"out of {device} memory on rank {_ranks(ranks)}: each of {workers} "
        f"workers runs train.batch_size {train.batch_size} samples at a time, "
        f"train.grad_accum_steps {train.grad_accum_steps} times per step (global batch "
        f"{train.batch_size * train.grad_accum_steps * workers}); lower train.batch_size and "
        f"raise train.grad_accum_steps by the same factor (same global batch){_smaller(cfg)}; "
        "the same command then resumes from the last checkpoint"
    )


def _steadier(cfg: Recipe) -> str:
    """What makes a run that diverged train steadily, from the recipe's own settings."""
    changes = ["a lower train.lr"]
    if not cfg.train.clip_grad_norm:
        changes.append("train.clip_grad_norm (e.g. 1.0)")
    if cfg.precision.dtype != "fp32":
        changes.append("precision.dtype=fp32")
    return ", ".join(changes[:-1]) + " or " + changes[-1] if len(changes) > 1 else changes[0]


def _smaller(cfg: Recipe) -> str:
    """Half-precision activations, where the recipe is not in them already."""
    return ", or use precision.dtype=bf16" if cfg.precision.dtype == "fp32" else ""


# gloo's words when a collective's wait ends ("Timed out waiting 5000ms for recv operation to
# complete"), and NCCL's watchdog's when it reports one instead of ending the process
TIMED_OUT = re.compile(r"Timed out waiting \d+ ?ms for \w+ operation|collective operation timeout")


def timed_out(failures: Failures, cfg: Recipe) -> str | None:
    """Ranks that gave up waiting for another rank, in a collective or at a report."""
    timeout = f"scaling.timeout_s={cfg.scaling.timeout_s} s"
    in_collective = [
        rank
        for rank, error in failures.items()
        if isinstance(error, CollectiveFailed)
        or (isinstance(error, RuntimeError) and TIMED_OUT.search(str(error)))
    ]
    at_report = {rank: _report_timeout_ranks(error) for rank, error in failures.items()}
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
        f"checkpoint on one rank), raise scaling.timeout_s; {RESUMES}"
    )


def _report_timeout_ranks(error: BaseException) -> list[int] | None:
    if not _is_a(error, "BroadcastCollectiveTimeoutError"):  # Ray Train's, where it runs
        return None
    return ray_compat.report_timeout_ranks(error)


NO_SPACE = "No space left on device"
"""The OS's words, also in the messages of errors that carry no errno (pyarrow's copies)."""


def disk_full(failures: Failures, run_dir: str) -> str | None:
    full = {
        rank: error
        for rank, error in failures.items()
        if isinstance(error, OSError) and (error.errno == errno.ENOSPC or NO_SPACE in str(error))
    }
    if not full:
        return None
    rank, error = next(iter(full.items()))
    where = f"writing {error.filename}" if error.filename else f"in {run_dir}"
    return (
        f"the disk is full: {NO_SPACE} {where} (rank {rank}); {_latest(run_dir)}; free space "
        "there, then re-run the same command to resume"
    )


def _latest(run_dir: str) -> str:
    """Where a resume starts: the run's latest valid checkpoint, by its manifest."""
    from trainforge import checkpoint

    folder = storage.local_folder(run_dir)
    if folder is None:  # remote storage: nothing to look into from here
        return "the checkpoints saved before it are kept"
    newest = checkpoint.newest_verified(folder) if folder.is_dir() else None
    if newest is None:
        return "no checkpoint was saved before it"
    manifest = json.loads((newest / checkpoint.MANIFEST_FILE).read_text())
    return f"the latest valid checkpoint is {newest.name} (step {manifest['global_step']})"


def worker_died(failures: Failures) -> str | None:
    """The first worker whose process died: the others' errors only follow from it (a
    collective's peer gone)."""
    for error in failures.values():
        if isinstance(error, WorkerDied):
            return f"{error}; {RESUMES}"
    return None


def _is_a(error: BaseException, class_name: str) -> bool:
    """Told by its class's name: the driver imports neither torch nor Ray Train to tell it."""
    return any(c.__name__ == class_name for c in type(error).__mro__)


def _ranks(ranks: list[int]) -> str:
    return ", ".join(map(str, sorted(ranks)))
