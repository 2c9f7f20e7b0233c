"""Driver side of ``trainforge train``: check what can be checked, pick the worker group
(``workers.choose``) and run the recipe on it (``run.py``).

Every check that can fail because of the user's request happens here, before any worker
starts, and raises RecipeError.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from trainforge import config, log, storage
from trainforge.config import Recipe
from trainforge.driver import console, finished_run, recipe_change, stage
from trainforge.driver.cluster import connect, storage_root
from trainforge.driver.run import Outcome, run_workers, worker_payload
from trainforge.driver.run_lock import one_at_a_time
from trainforge.driver.workers import choose
from trainforge.errors import RecipeError


def check_existing_run(cfg: Recipe, storage_path: str) -> Path | None:
    """Refuse a run name taken without ``checkpoint.resume``, or whose checkpoints all fail
    verification; the folder of the checkpoint a resume starts from (None: a new run, or
    remote storage)."""
    folder = storage.local_folder(storage_path)
    if folder is None:
        return None
    run_dir = folder / cfg.run.name
    if run_dir.exists() and not cfg.checkpoint.resume:
        raise RecipeError(
            f"run.name: a run named {cfg.run.name!r} exists at {run_dir} and checkpoint.resume is "
            "false; pick another run.name or set checkpoint.resume=true"
        )
    if not run_dir.is_dir():
        return None  # a new run: no checkpoints to check
    from trainforge.checkpoint import check_resumable

    return check_resumable(run_dir)  # checkpoints that all fail verification: refused


@one_at_a_time  # a second command with the same run.name refuses
def train(cfg: Recipe) -> Outcome:
    """Run the recipe to completion."""
    from trainforge.workloads import check_workload_data

    check_workload_data(cfg.workload)
    root = storage_root(cfg.run)
    resumed_from = check_existing_run(cfg, root)  # verified once: its files are hashed here
    folder = storage.local_folder(root)
    run_dir = folder / cfg.run.name if folder is not None else None  # None: remote storage
    request = finished_run.requested(cfg)  # as given: `auto` is resolved from here on
    done = finished_run.nothing_left(run_dir, request, resumed_from)
    if run_dir is not None and done is not None:  # a finished run: its outcome, no worker
        return _finished_earlier(cfg, run_dir, done)
    outcome = _train(cfg, root, resumed_from)
    if outcome.exit_code == 0 and run_dir is not None:
        finished_run.record(run_dir, request, outcome)
    return outcome


def _finished_earlier(cfg: Recipe, run_dir: Path, done: dict[str, Any]) -> Outcome:
    """The outcome of a run that has nothing left to train (``finished_run.record``'s keys),
    said again."""
    checkpoint = str(run_dir / done["checkpoint"])
    run_id, uri = done.get("mlflow_run_id"), done.get("tracking_uri")
    heading = (
        f"run {cfg.run.name!r} finished earlier ({done.get('finished_at')}): nothing left to train"
    )
    metrics = done["metrics"]
    console.summary(cfg.run.name, metrics, checkpoint, (run_id, uri or "") if run_id else None,
                    heading)  # fmt: skip
    log.say("a larger train.epochs or train.max_steps trains it further (unless early stopping "
            "ended it); a new run.name starts afresh")  # fmt: skip
    return Outcome(0, metrics, checkpoint, run_id, uri, recipe=cfg)


def _train(cfg: Recipe, root: str, resumed_from: Path | None) -> Outcome:
    """The run, on the worker group ``choose`` picks."""
    from trainforge.workloads import start_workload_data

    runner = stage.Runner()  # where the data stage runs
    start_workload_data(cfg.workload, cfg.run.seed, root, runner)  # needs no cluster: begun now
    with choose(cfg, root) as group:
        # another recipe: refused before any worker starts, or said (its workload section once
        # its data is located, below)
        recipe_change.check(group.cfg, root, resumed_from, free=("workload.",))
        group.start()  # their imports overlap the data stage
        # From here on the run uses the resolved recipe: workers, MLflow and checkpoints see the
        # worker count, device and data paths that were decided, not "auto".
        cfg = config.resolve_data(group.cfg, root, runner)
        recipe_change.check(cfg, root, resumed_from, only=("workload.",))
        outcome = run_workers(cfg, worker_payload(cfg, root), group)
    group.after(outcome.exit_code)
    return outcome


def simulate(cfg: Recipe) -> int:
    """`trainforge simulate`: only the data stage (SBI simulations), on the Ray cluster."""
    prepare_data(cfg)
    return 0


def prepare_data(cfg: Recipe, checked: bool = False) -> Any:
    """The data stage alone (SBI simulations, made or found in the cache, on the Ray cluster
    this process joins): the workload section with the data's place filled in. ``checked``:
    the caller ran the recipe's data check (``check_workload_data``) already."""
    from trainforge.workloads import (
        check_workload_data,
        resolve_workload,
        spec_for,
        start_workload_data,
    )

    if spec_for(cfg.workload.kind).start_data is None:  # a family with a data stage begins it
        raise RecipeError(f"workload.kind: {cfg.workload.kind} has no simulation stage (sbi has)")
    if not checked:
        check_workload_data(cfg.workload)
    root = storage_root(cfg.run)
    storage.check_writable(root, cfg.run.name)  # the simulations are written under it
    runner = stage.Runner()
    start_workload_data(cfg.workload, cfg.run.seed, root, runner)
    connect()
    return resolve_workload(cfg.workload, cfg.run.seed, root, runner)  # says where the data are
