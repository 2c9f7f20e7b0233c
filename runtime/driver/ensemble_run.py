"""`trainforge train` of an SBI recipe with ``workload.ensemble: K`` above 1: K posteriors
trained apart on the same simulations and combined, in one command.

The simulations are made (or found in the cache) once, here. Each member is then the run a
user would start by hand: ``trainforge train`` of the same recipe and overrides in a process of
its own, with ``run.seed`` + k, ``workload.simulation.path`` set to those simulations, and its
folder under ``<run folder>/members/``. So each member has the whole loop's behaviour (early
stopping, checkpoints, resume, evaluation, its MLflow run, nested under the ensemble's), and
Ray places the members like any runs: as many at once as the cluster's GPUs (or CPUs) hold,
one GPU each for a one-GPU recipe. When every member has finished, their posteriors are
combined (``workloads/sbi/ensemble.py``) into the run folder's ``posterior.pt``, which
``load_posterior`` opens as sbi's ``EnsemblePosterior``.

Why: on slcp at 10^6 simulations, eight-member mixtures scored C2ST 0.540 and 0.542 where
their members scored 0.570-0.610 and no single run came below 0.569
(``recipes/sbi/slcp_ensemble_1e6.yaml``).

Re-running the command resumes: members with a posterior are kept, the others resume from
their own checkpoints, and the ensemble is written again from all of them.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

from trainforge import config, log
from trainforge.atomic import replacing
from trainforge.config import Recipe
from trainforge.driver import mlflow_run
from trainforge.driver.child_runs import (
    ChildRun,
    check_before_start,
    child_env,
    earlier_scores,
    local_run_held,
    loudness,
    run_children,
    runs_at_once,
)
from trainforge.tracking.client import redact, redact_all

MEMBERS_FOLDER = "members"
ENSEMBLE_RECORD = "ensemble.json"
EVALUATION_FOLDER = "evaluation"  # the ensemble's figures


def train(cfg: Recipe, recipe: str, overrides: list[str]) -> int:
    """The whole ensemble: simulations, members, the combined posterior; the exit status."""
    why = "the members' posteriors are combined from files"
    with local_run_held(cfg, "workload.ensemble", why) as root:
        return _train(cfg, recipe, overrides, root)


def _train(cfg: Recipe, recipe: str, overrides: list[str], root: str) -> int:
    import ray

    from trainforge.driver import launch
    from trainforge.workloads import spec_for

    started = time.time()
    ensembles = spec_for(cfg.workload.kind).ensembles
    assert ensembles is not None, "only a family whose runs combine has members"
    count = ensembles.members(cfg.workload)
    run_dir = Path(root) / cfg.run.name
    # members kept from an earlier command had the same recipe
    check_before_start(cfg, root, run_dir, free=("workload.ensemble",))
    workload = launch.prepare_data(cfg, checked=True)  # made once here, for every member
    simulations = str(workload.simulation.path)  # type: ignore[attr-defined]
    members_root = run_dir / MEMBERS_FOLDER
    members = _members(cfg, count, members_root, run_dir / ENSEMBLE_RECORD, ensembles.output)
    at_once = runs_at_once(cfg, ray.cluster_resources(), count)
    kept = sum(m.kept for m in members)
    log.say(
        f"ensemble: {count} members (run.seed {cfg.run.seed}-{cfg.run.seed + count - 1}) on the "
        f"same simulations, {at_once} at a time"
        + (f"; {kept} finished earlier, kept" if kept else "")
    )
    handle = None
    if cfg.tracking.enabled:  # the ensemble's own MLflow run; the members' runs are its children
        handle = mlflow_run.start(cfg, root)
    env = child_env(handle.run_id if handle else None, ray)
    command = member_command(recipe, overrides, simulations, members_root)
    status = "FAILED"
    try:
        run_children([m for m in members if not m.kept], command, env, at_once, "ensemble")
        failed = [m for m in members if not m.kept and m.exit_code != 0]
        if failed:
            names = ", ".join(f"{m.label} (exit {m.exit_code})" for m in failed)
            log.error(f"ensemble: members failed: {names}; their output is above")
            log.error("re-run the same command to resume: finished members are kept")
            return 1
        posterior = run_dir / ensembles.output
        combined = ensembles.combine([m.folder for m in members], posterior)
        metrics, files = ensembles.evaluate(posterior, workload, cfg.run.seed,
                                            run_dir / EVALUATION_FOLDER)  # fmt: skip
        write_record(run_dir / ENSEMBLE_RECORD, cfg, members, simulations, metrics)
        if handle is not None:
            _log_ensemble(handle, posterior, combined["members"], metrics, files)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if handle is not None:
            from trainforge.tracking import driver as tracking

            tracking.finish_run(handle, status, None)
    summary(cfg.run.name, members, posterior, metrics, time.time() - started, handle)
    return 0


def _members(cfg: Recipe, count: int, root: Path, record: Path, output: str) -> list[ChildRun]:
    """The ensemble's members, each with its seed and folder under ``root``; those that
    finished in an earlier command (their ``output`` is there) kept, with what they scored."""
    earlier = earlier_scores(record, "members")
    members = []
    for k in range(count):
        name = f"{cfg.run.name}-m{k}"
        member = ChildRun(k, cfg.run.seed + k, name, root / name)
        member.kept = (member.folder / output).is_file()
        if member.kept:  # what it scored when it finished, for the table and the record
            member.metrics = earlier.get(member.name, {})
        members.append(member)
    return members


def member_command(
    recipe: str, overrides: list[str], simulations: str, members_root: Path
) -> list[str]:
    """The member's command line, less its run.name and run.seed: the same recipe and
    overrides, on the ensemble's simulations, one member each."""
    return [
        sys.executable, "-m", "trainforge", "train", *loudness(), recipe, *overrides,
        "workload.ensemble=1",
        f"workload.simulation.path={simulations}",
        f"run.storage_path={members_root}",
    ]  # fmt: skip


def write_record(
    path: Path, cfg: Recipe, members: list[ChildRun], simulations: str, metrics: dict[str, float]
) -> None:
    """What the ensemble is made of and how it scored, beside its posterior."""
    record = {
        "members": [
            {"name": m.name, "seed": m.seed, "folder": str(m.folder), **m.metrics} for m in members
        ],
        "metrics": metrics,
        "simulations": simulations,
        "recipe": redact_all(config.to_yaml(cfg)),  # no credentials in files
    }
    with replacing(path) as temporary:
        temporary.write_text(json.dumps(record, indent=1) + "\n")


def _log_ensemble(
    handle: Any, posterior: Path, members: int, metrics: dict[str, float], files: list[Path]
) -> None:
    """The combined posterior, its evaluation and its size, on the ensemble's MLflow run."""
    from mlflow.tracking import MlflowClient

    if handle.run_id is None:
        return
    try:
        client = MlflowClient(tracking_uri=handle.tracking_uri)
        for key, value in {"ensemble/members": float(members), **metrics}.items():
            client.log_metric(handle.run_id, key, value)
        client.log_artifact(handle.run_id, str(posterior), "posterior")
        for file in files:
            client.log_artifact(handle.run_id, str(file), "evaluation")
    except Exception as exc:  # tracking never fails a run
        log.warn(f"could not log the ensemble to MLflow ({log.first_line(exc)})")


def summary(
    name: str,
    members: list[ChildRun],
    posterior: Path,
    metrics: dict[str, float],
    seconds: float,
    handle: Any,
) -> None:
    log.result(f"ensemble '{name}' finished in {seconds:.1f} s: {len(members)} members")
    for m in members:
        numbers = "  ".join(f"{k} {v}" for k, v in sorted(m.metrics.items(), reverse=True))
        state = f"{numbers}  (kept from an earlier command)" if m.kept else numbers
        log.result(f"  {m.label}  run.seed {m.seed}  {state.strip()}".rstrip())
    scores = "  ".join(f"{k} {v:.4f}" for k, v in metrics.items() if k.startswith("c2st/obs"))
    if "c2st/mean" in metrics:
        log.result(f"  ensemble  c2st/mean {metrics['c2st/mean']:.4f}  ({scores})")
    log.result(f"  posterior    {posterior} (sbi's EnsemblePosterior of {len(members)})")
    if handle is not None and handle.run_id is not None:
        uri = redact(handle.tracking_uri)
        log.result(f"  mlflow run   {handle.run_id} at {uri} (the members' runs nested)")
