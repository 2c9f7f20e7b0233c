"""`trainforge train` of a recipe with ``workload.rounds`` above 1: sequential rounds, each
round's data made from what the round before learned, in one command.

For each round this command makes the round's data with the family's data stage, on the
cluster it joins (the same cached, resumable stage as any run's: SBI's simulations spread over
the cluster's cores), from the proposal the family draws from the previous round's output
(``Rounds.propose``: for SBI, θ from the previous posterior at the observation). The round is
then the run a user would start by hand: ``trainforge train`` of the same recipe and overrides
in a process of its own, on the data of every round so far, its folder under
``<run folder>/rounds/``, its MLflow run nested under this command's. When the last round has
finished, its output (SBI: ``posterior.pt``) becomes the run folder's, which
``trainforge.load`` opens.

Re-running the command resumes: finished rounds are kept (their proposals and data are files in
the run folder and the cache, so nothing finished is simulated again), the round it reached
resumes from its data stage's finished chunks and its run's checkpoints.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
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
)
from trainforge.tracking.client import redact, redact_all
from trainforge.workloads.spec import Rounds

ROUNDS_FOLDER = "rounds"
ROUNDS_RECORD = "rounds.json"


def train(cfg: Recipe, recipe: str, overrides: list[str]) -> int:
    """Every round: its data, its run; the last round's output as the run's; the exit status."""
    why = "each round is drawn from the files of the round before"
    with local_run_held(cfg, "workload.rounds", why) as root:
        return _train(cfg, recipe, overrides, root)


def _train(cfg: Recipe, recipe: str, overrides: list[str], root: str) -> int:
    import ray

    from trainforge.workloads import spec_for

    started = time.time()
    rounds = spec_for(cfg.workload.kind).rounds
    assert rounds is not None, "only a family with sequential rounds has rounds"
    count = rounds.count(cfg.workload)
    run_dir = Path(root) / cfg.run.name
    check_before_start(cfg, root, run_dir, free=())  # finished rounds are kept: same recipe
    folder = run_dir / ROUNDS_FOLDER
    runs = [ChildRun(k, cfg.run.seed + k, f"{cfg.run.name}-r{k}", folder / f"{cfg.run.name}-r{k}",
                     prefix="r") for k in range(count)]  # fmt: skip
    earlier = earlier_scores(run_dir / ROUNDS_RECORD, "rounds")
    for run in runs:
        run.kept = (run.folder / rounds.output).is_file()
        if run.kept:  # what it scored when it finished, for the table and MLflow
            run.metrics = earlier.get(run.name, {})
    kept = sum(r.kept for r in runs)
    log.say(f"sequential: {count} rounds" + (f"; {kept} finished earlier, kept" if kept else ""))
    handle = mlflow_run.start(cfg, root) if cfg.tracking.enabled else None
    status = "FAILED"
    try:
        made: list[Any] = []  # each round's section with its data made
        for run in runs:
            made.append(_round_data(cfg, rounds, run, runs, folder))
            if run.kept:
                continue
            env = child_env(handle.run_id if handle else None, ray)
            data = rounds.training_data(made, folder / f"data-r{run.index}")
            command = [sys.executable, "-m", "trainforge", "train", *loudness(), recipe,
                       *overrides, *rounds.overrides, *data,
                       f"run.storage_path={folder}"]  # fmt: skip
            run_children([run], command, env, 1, "sequential")
            if run.exit_code != 0:
                log.error(f"sequential: round {run.label} failed (exit {run.exit_code}); its "
                          "output is above; re-run the same command to resume from it")  # fmt: skip
                return 1
            _write_record(run_dir / ROUNDS_RECORD, cfg, runs)  # its scores, kept for a re-run
        output = run_dir / rounds.output
        with replacing(output) as temporary:
            shutil.copyfile(runs[-1].folder / rounds.output, temporary)
        if handle is not None:
            _log_rounds(handle, output, runs)
        status = "FINISHED"
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    finally:
        if handle is not None:
            from trainforge.tracking import driver as tracking

            tracking.finish_run(handle, status, None)
    _summary(cfg.run.name, runs, output, time.time() - started, handle)
    return 0


def _round_data(cfg: Recipe, rounds: Rounds[Any], run: ChildRun, runs: list[ChildRun],
                folder: Path) -> Any:  # fmt: skip
    """The round's data made (or found): after the first round, from its proposal, drawn from
    the round before's output once and kept in the run folder."""
    from trainforge.driver import launch

    proposal = None
    if run.index > 0:
        proposal = folder / f"proposal-r{run.index}.pt"
        if not proposal.is_file():  # seconds to minutes: said before and after
            before = runs[run.index - 1]
            log.say(f"sequential: round {run.label}: drawing its proposal from round "
                    f"{before.label}'s output")  # fmt: skip
            began = time.perf_counter()
            said = rounds.propose(cfg.workload, before.folder, run.seed, proposal)
            log.say(f"sequential: round {run.label}: {said}; {time.perf_counter() - began:.1f} s")
    stage = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, seed=run.seed),
                                workload=rounds.for_stage(cfg.workload, proposal))  # fmt: skip
    return launch.prepare_data(stage, checked=True)  # check_before_start checked the recipe


def _write_record(path: Path, cfg: Recipe, runs: list[ChildRun]) -> None:
    """The rounds and what each scored so far, in the run folder (at each round's end)."""
    each = [{"name": r.name, "seed": r.seed, "folder": str(r.folder), **r.metrics} for r in runs]
    record = {"rounds": each, "recipe": redact_all(config.to_yaml(cfg))}  # no credentials
    with replacing(path) as temporary:
        temporary.write_text(json.dumps(record, indent=1) + "\n")


def _log_rounds(handle: Any, output: Path, runs: list[ChildRun]) -> None:
    """Each round's scores at its step (1, 2, …) and the final output, on the command's run."""
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

    if handle.run_id is None:
        return
    try:
        client = MlflowClient(tracking_uri=handle.tracking_uri)
        now = int(time.time() * 1000)
        rows = [Metric(f"round/{key}", float(value), now, run.index + 1)
                for run in runs for key, value in run.metrics.items()]  # fmt: skip
        rows.append(Metric("rounds", float(len(runs)), now, 0))
        client.log_batch(handle.run_id, metrics=rows)
        client.log_artifact(handle.run_id, str(output), "posterior")
    except Exception as exc:  # tracking never fails a run
        log.warn(f"could not log the rounds to MLflow ({log.first_line(exc)})")


def _summary(name: str, runs: list[ChildRun], output: Path, seconds: float, handle: Any) -> None:
    log.result(f"sequential '{name}' finished in {seconds:.1f} s: {len(runs)} rounds")
    for r in runs:
        numbers = "  ".join(f"{k} {v}" for k, v in sorted(r.metrics.items(), reverse=True))
        state = f"{numbers}  (kept from an earlier command)" if r.kept else numbers
        log.result(f"  {r.label}  {state.strip()}".rstrip())
    log.result(f"  output       {output} (the last round's)")
    if handle is not None and handle.run_id is not None:
        log.result(f"  mlflow run   {handle.run_id} at {redact(handle.tracking_uri)} (the "
                   "rounds' runs nested)")  # fmt: skip
