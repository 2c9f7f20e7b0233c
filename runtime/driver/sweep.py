"""`trainforge sweep`: trials of one recipe with settings drawn from ``sweep.space``, picked
(Optuna's TPE, or at random) and stopped early (ASHA) by Ray Tune on this command's Ray
cluster.

Each trial is the run a user would start by hand (``sweep_trial.py``), named
``<run.name>-t<index>``, its folder under ``<run folder>/trials/``, its MLflow run nested under
the sweep's; the sweep's own run gets the trials' table, the best trial and two figures
(``sweep_record.py``). A trial that fails is recorded with its reason and the sweep goes on.

Re-running the command resumes the sweep (Tune's restore): finished trials are kept,
unfinished ones resume from their own checkpoints, the rest are started.
"""

from __future__ import annotations

import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from trainforge import config, log, settings, storage
from trainforge.config import Recipe
from trainforge.config.sweep_space import Dimension, override_value, parse
from trainforge.driver import mlflow_run
from trainforge.driver.child_runs import (
    RECIPE_FILE,
    check_recipe,
    child_env,
    loudness,
    runs_at_once,
)
from trainforge.driver.cluster import connect, storage_root
from trainforge.driver.sweep_console import SweepConsole, Trial
from trainforge.driver.sweep_trial import TrialJob, TrialRun, trial_name
from trainforge.errors import RecipeError

TRIALS_FOLDER = "trials"
TUNE_FOLDER = "tune"  # Ray Tune's experiment state: what a re-run restores
EPOCH_METRICS = ("train/", "val/")  # reported every epoch; anything else once, at a run's end


def check(cfg: Recipe, recipe: Path, overrides: list[str]) -> list[Dimension]:
    """The space, before anything starts: each dimension's ends (every choice) load as the
    recipe's own values do, and the metric suits the scheduler."""
    section = cfg.sweep
    dimensions = parse(section.space)
    if not dimensions:
        raise RecipeError("sweep.space: empty; name the settings to search, e.g. "
                          "sweep.space.train.lr='loguniform(1e-4, 1e-1)'")  # fmt: skip
    for dimension in dimensions:
        for value in dimension.candidates():
            written = f"{dimension.key}={override_value(value)}"
            try:
                config.load(recipe, [*overrides, written])
            except RecipeError as exc:
                raise RecipeError(f"sweep.space.{dimension.key}: {dimension.written()} reaches "
                                  f"{override_value(value)}, which the recipe refuses "
                                  f"({log.first_line(exc)})") from None  # fmt: skip
    if section.search == "grid":
        drawn = [d for d in dimensions if d.kind != "choice"]
        if drawn:
            raise RecipeError(f"sweep.search: grid tries every combination of choice() values; "
                              f"sweep.space.{drawn[0].key} is {drawn[0].written()}")  # fmt: skip
    if section.scheduler == "asha" and not section.metric.startswith(EPOCH_METRICS):
        raise RecipeError(f"sweep.metric: {section.metric} is measured once, at a run's end; "
                          "asha compares a metric every epoch (val/loss, val/accuracy): set "
                          "sweep.scheduler=fifo")  # fmt: skip
    if storage.local_folder(storage_root(cfg.run)) is None:
        raise RecipeError(f"run.storage_path: a sweep keeps its trials' table and Ray Tune's "
                          f"state in a folder, not at {cfg.run.storage_path!r}")  # fmt: skip
    return dimensions


def sweep(cfg: Recipe, recipe: str, overrides: list[str], dimensions: list[Dimension]) -> int:
    """The whole sweep; the exit status (0 when at least one trial finished)."""
    from trainforge.driver.run_lock import run_held

    root = storage_root(cfg.run)
    with run_held(root, cfg.run.name):  # a second command refuses
        return _sweep(cfg, recipe, overrides, dimensions, Path(root) / cfg.run.name)


def _sweep(
    cfg: Recipe, recipe: str, overrides: list[str], dimensions: list[Dimension], run_dir: Path
) -> int:
    import ray

    from trainforge.driver import sweep_board, sweep_record
    from trainforge.workloads import check_workload_data

    started = time.time()
    check_workload_data(cfg.workload)  # what every trial would refuse, before anything starts
    if run_dir.exists() and not cfg.checkpoint.resume:
        raise RecipeError(f"run.name: a sweep named {cfg.run.name!r} exists at {run_dir} and "
                          "checkpoint.resume is false; pick another run.name")  # fmt: skip
    _check_same_sweep(cfg, run_dir)
    check_recipe(cfg, run_dir, free=())
    trials_dir = run_dir / TRIALS_FOLDER
    trials_dir.mkdir(parents=True, exist_ok=True)
    connect()
    section = cfg.sweep
    count = trial_count(section, dimensions)
    at_once = section.at_once or runs_at_once(cfg, ray.cluster_resources(), count)
    handle = mlflow_run.start(cfg, str(run_dir.parent)) if cfg.tracking.enabled else None
    env = child_env(handle.run_id if handle else None, ray)
    env[settings.PROGRESS_EVENTS.name] = "1"
    command = [sys.executable, "-m", "trainforge", "train", *loudness(), recipe, *overrides,
               "checkpoint.resume=true", f"run.storage_path={trials_dir}"]  # fmt: skip
    job = TrialJob(command, env, str(trials_dir), section.metric, os.getcwd())
    console = SweepConsole(cfg.run.name, section.metric, section.direction(), trials_dir)
    try:
        trials = _run_tune(cfg, dimensions, job, console, run_dir, at_once)
    except BaseException as exc:  # Ctrl-C (the trials' commands end as a stopped run's do)
        if handle is not None:
            sweep_record.end(handle, "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED")
        raise
    finally:
        sweep_board.close_drawn()  # the closing table, or the Ctrl-C line, on a clean screen
    status = "FINISHED" if any(t.state == "finished" for t in trials) else "FAILED"
    files = sweep_record.write(run_dir, trials, dimensions, section.metric, section.direction())
    if handle is not None:
        sweep_record.log_to_mlflow(handle, trials, section.metric, section.direction(), files)
        sweep_record.end(handle, status)
    console.summary(trials, time.time() - started, handle)
    return 0 if status == "FINISHED" else 1


def _check_same_sweep(cfg: Recipe, run_dir: Path) -> None:
    """A re-run resumes the sweep as it began (Tune restores its search, trial count and
    concurrency): another ``sweep`` section is refused, naming what changed. The rest of the
    recipe is compared as a resumed run's is (``child_runs.check_recipe``)."""
    from omegaconf import OmegaConf

    from trainforge.driver import recipe_change

    saved_file = run_dir / RECIPE_FILE
    if not saved_file.is_file():
        return
    saved = OmegaConf.to_container(OmegaConf.load(saved_file)).get("sweep", {})  # type: ignore[union-attr]
    old = recipe_change.flatten(saved)
    new = recipe_change.flatten(config.to_container(cfg)["sweep"])
    keys = sorted(old.keys() | new.keys())
    changed = [f"sweep.{k} {old.get(k)!r} -> {new.get(k)!r}" for k in keys
               if old.get(k) != new.get(k)]  # fmt: skip
    if changed:
        raise RecipeError(f"run.name: sweep {cfg.run.name!r} began with another sweep section "
                          f"({', '.join(changed)}); the same command resumes it, a new run.name "
                          "starts another")  # fmt: skip


def _run_tune(
    cfg: Recipe,
    dimensions: list[Dimension],
    job: TrialJob,
    console: SweepConsole,
    run_dir: Path,
    at_once: int,
) -> list[Trial]:
    """Ray Tune's run of the trials (or its restore), the trials as they ended."""
    from ray import tune

    _tune_settings()
    node = f"node:{_this_node_ip()}"
    # the trial's command runs beside this one (the recipe, the user's code, the working
    # directory are here); its workers go wherever Ray places them
    trainable = tune.with_resources(
        tune.with_parameters(TrialRun, job=job), {"CPU": 0, node: 0.001}
    )
    tune_dir = run_dir / TUNE_FOLDER
    section = cfg.sweep
    if tune.Tuner.can_restore(str(tune_dir)):
        console.resuming()
        tuner = tune.Tuner.restore(str(tune_dir), trainable, resume_unfinished=True,
                                   resume_errored=False, restart_errored=False)  # fmt: skip
    else:
        tuner = tune.Tuner(
            trainable,
            param_space={d.key: _domain(d, section.search) for d in dimensions},
            tune_config=tune.TuneConfig(
                metric=section.metric,
                mode=section.direction(),
                num_samples=1 if section.search == "grid" else section.trials,
                search_alg=_searcher(cfg, at_once),
                scheduler=_scheduler(cfg),
                max_concurrent_trials=at_once,
                # the next trial's command starts in the actor of one that ended, once its
                # run has ended: a new actor per trial costs seconds
                reuse_actors=True,
                trial_name_creator=lambda t: trial_name(cfg.run.name, _index(t, section.search)),
                trial_dirname_creator=lambda t: trial_name(cfg.run.name, _index(t, section.search)),
            ),
            run_config=tune.RunConfig(
                name=TUNE_FOLDER,
                storage_path=str(run_dir),
                verbose=0,
                callbacks=[console.tune_callback(trial_count(section, dimensions))],
                # a trial's run keeps its own checkpoints: a restored trial's command resumes
                checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=False),
            ),
        )
    console.begin(section, dimensions, trial_count(section, dimensions), at_once)
    results = tuner.fit()
    return console.trials_from(results)


def _tune_settings() -> None:
    """Ray Tune as this command needs it; read from the environment only."""
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")  # Tune's boxes and tables: ours instead
    # the sweep's state written every second (Tune's own: every 10 s or more), so a killed
    # sweep's re-run knows the trials that ended before it was killed
    os.environ.setdefault("TUNE_GLOBAL_CHECKPOINT_S", "1")
    # Ctrl-C stops the command as it stops `trainforge train` (one line, exit 130, the MLflow
    # run KILLED); Tune's own handler would end the experiment and return as if it had ended
    os.environ.setdefault("TUNE_DISABLE_SIGINT_HANDLER", "1")
    # Tune's own lines (a restored trial without results yet, its state written) are for
    # Tune's developers; a trial's failure is said by TrialLines
    logging.getLogger("ray.tune").setLevel(logging.ERROR)
    logging.getLogger("ray.train").setLevel(logging.ERROR)


def _index(trial: Any, search: str) -> str:
    """The trial's index in the sweep, from 1: Tune's own count, the start of its experiment
    tag, kept in the experiment's state across a restore (its random and grid searches count
    from 0, Optuna's from 1)."""
    count = int(str(trial.experiment_tag).split("_", 1)[0])
    return str(count if search == "optuna" else count + 1)


def trial_count(section: Any, dimensions: list[Dimension]) -> int:
    """How many trials the sweep runs: ``sweep.trials``, or a grid's combinations."""
    if section.search != "grid":
        return int(section.trials)
    return math.prod(len(d.values) for d in dimensions)


def _domain(dimension: Dimension, search: str) -> Any:
    from ray import tune

    if search == "grid":
        return tune.grid_search(list(dimension.values))

    low_high = dimension.values
    if dimension.kind == "uniform":
        return tune.uniform(*low_high)
    if dimension.kind == "loguniform":
        return tune.loguniform(*low_high)
    if dimension.kind == "randint":
        return tune.randint(low_high[0], low_high[1] + 1)  # Tune's high is left out
    return tune.choice(list(dimension.values))


def _searcher(cfg: Recipe, at_once: int) -> Any:
    """Optuna's TPE, or Tune's own generator of random draws and grid combinations (which
    takes its own limit: Tune applies ``max_concurrent_trials`` to searchers only)."""
    if cfg.sweep.search == "optuna":
        import optuna
        from ray.tune.search.optuna import OptunaSearch

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        return OptunaSearch(seed=cfg.run.seed)
    from ray.tune.search.basic_variant import BasicVariantGenerator

    return BasicVariantGenerator(random_state=cfg.run.seed, max_concurrent=at_once)


def _scheduler(cfg: Recipe) -> Any:
    from ray.tune.schedulers import ASHAScheduler, FIFOScheduler

    if cfg.sweep.scheduler == "fifo":
        return FIFOScheduler()
    # a trial's last epoch is never a reason to stop it: it finishes (its evaluation, its
    # model) rather than ending KILLED at max_t
    epochs = cfg.train.epochs if cfg.train.max_steps is None and cfg.train.epochs else 10**6
    return ASHAScheduler(time_attr="epoch", max_t=epochs + 1, grace_period=cfg.sweep.grace_epochs)


def _this_node_ip() -> str:
    import ray

    return str(ray.util.get_node_ip_address())
