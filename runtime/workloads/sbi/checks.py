"""The driver's side of an SBI recipe: its checks before Ray, the rows it will train on, and the
simulation stage's call. No torch for a built-in task (``catalogue.py`` has its dimensions and
cache fingerprint): importing torch is seconds of every command on a GPU machine. A user's
prior and simulator are imported and probed here, and they bring torch with them."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from trainforge import log
from trainforge.config.schema import Recipe
from trainforge.errors import RecipeError, did_you_mean
from trainforge.workloads import user_code
from trainforge.workloads.sbi import (
    architecture,
    catalogue,
    methods,
    observations,
    rounds,
    simulate,
    simulations,
)
from trainforge.workloads.sbi.config import SBIWorkloadConfig
from trainforge.workloads.stage import StageRunner


def check(cfg: SBIWorkloadConfig, recipe: Recipe) -> None:
    """The task name and rules against other sections (the section checks its own values);
    user code is imported by ``check_data``."""
    known, custom = catalogue.KNOWN_TASKS, catalogue.CUSTOM
    if cfg.task not in known:
        raise RecipeError(
            f"workload.task: {cfg.task!r} is not a known task{did_you_mean(cfg.task, known)}; "
            f"choose one of: {', '.join(known)}"
        )
    if cfg.task == custom and (cfg.prior is None or cfg.simulator is None):
        missing = " and ".join(k for k in ("prior", "simulator") if getattr(cfg, k) is None)
        raise RecipeError(
            f"workload.{missing.split(' ')[0]}: task {custom} needs {missing} as import "
            "paths, e.g. prior: my_pkg.sim:prior and simulator: my_pkg.sim:simulate"
        )
    if cfg.task != custom and (cfg.prior is not None or cfg.simulator is not None):
        raise RecipeError(
            f"workload.prior/simulator: only used with task: {custom} (task is {cfg.task!r})"
        )
    blocker = methods.get(cfg.method).graph_blocker if cfg.method in methods.METHODS else None
    if recipe.precision.cuda_graphs == "true" and blocker:
        raise RecipeError(
            f"precision.cuda_graphs: method {cfg.method}'s step cannot be captured as a CUDA "
            f"graph: {blocker}; use auto (eager steps after a failed capture) or false"
        )
    if cfg.simulation.path is None and cfg.simulation.cache_dir is None:
        # the stage's own rule: storage at a URI (s3://…) leaves the simulations no folder
        simulate.cache_root(cfg, str(recipe.run.storage_path))
    dtype = recipe.precision.dtype
    if dtype != "fp32":
        raise RecipeError(
            f"precision.dtype: {dtype} is not supported for workload.kind sbi; use fp32 "
            "(flow log-determinants and every method's loss need it; see the sbi workload docs)"
        )


def check_data(cfg: SBIWorkloadConfig) -> None:
    """Import and probe a user's prior and simulator; check a given simulation folder and a
    given copy of sbibm's files; check that the embedding net fits x."""
    observations.check(cfg)
    source = simulate.facts(cfg)
    if cfg.simulation.path is not None:
        folder = Path(cfg.simulation.path)
        if not folder.is_dir():
            raise RecipeError(f"workload.simulation.path: folder {folder} does not exist")
        if not (folder / simulations.MANIFEST).is_file():
            raise RecipeError(
                f"workload.simulation.path: {folder} holds no finished simulations "
                f"({simulations.MANIFEST} missing)"
            )
        manifest = simulations.read_manifest(folder)
        if (manifest["dim_theta"], manifest["dim_x"]) != (source.dim_theta, source.dim_x):
            raise RecipeError(
                f"workload.simulation.path: {folder} holds θ of dim {manifest['dim_theta']} and "
                f"x of dim {manifest['dim_x']}; the recipe's task has {source.dim_theta} and "
                f"{source.dim_x}"
            )
    if cfg.evaluation.observed is not None:  # a custom task's rounds (the section's rule)
        rounds.observed_x(cfg.evaluation.observed, source.dim_x)
    record = architecture.BuildRecord.from_config(
        cfg.estimator, source.dim_theta, source.dim_x, method=cfg.method
    )
    architecture.check_shape(record.embedding_input_shape, record.dim_x)
    if record.embedding != "none":  # built once here: sbi's own checks of its shape
        from trainforge.workloads.sbi import estimator

        if user_code.is_import_path(record.embedding):
            estimator.probe_embedding(record)  # the user's: run on two rows of x too
        else:
            estimator.embedding_net(record)
    if user_code.is_import_path(record.model) or record.model_kwargs:
        from trainforge.workloads.sbi import estimator

        estimator.probe_estimator(record)  # built, and its loss taken, on two rows


def train_samples(cfg: SBIWorkloadConfig) -> int:
    """Training rows under sbi's split rule: of the finished simulations when the recipe points
    at them (invalid ones dropped if asked), else of the simulations it asks for."""
    total = cfg.simulation.num_simulations
    folder = Path(cfg.simulation.path) if cfg.simulation.path else None
    if folder is not None and (folder / simulations.MANIFEST).is_file():
        manifest = simulations.read_manifest(folder)
        total = manifest["num_simulations"]
        if cfg.simulation.drop_invalid:
            total -= manifest["invalid"]
    return total - max(1, int(cfg.val_fraction * total))


def needs_cluster(cfg: SBIWorkloadConfig) -> bool:
    """Simulations to make that the command does not make itself (``simulate.simulates_here``)
    are spread over the cluster."""
    return cfg.simulation.path is None and not simulate.simulates_here(cfg)


def start_data(cfg: SBIWorkloadConfig, seed: int, storage_root: str, runner: StageRunner) -> None:
    """Small simulations of a built-in task begin before the cluster is reached
    (``simulate.start_early``); a given simulation folder needs nothing."""
    simulate.start_early(cfg, seed, storage_root, runner)


def prepare_data(
    cfg: SBIWorkloadConfig, seed: int, storage_root: str, runner: StageRunner | None
) -> SBIWorkloadConfig:
    """The simulation stage, unless the recipe points at finished simulations. Returns the
    section with ``code_dir`` (a custom task: where its prior and simulator were imported
    from, for Ray tasks and workers on other machines) and ``simulation.path`` filled in;
    refuses NaN/inf simulations unless the recipe drops them. sbibm's observations are located
    (fetched once) first: a machine that cannot get them fails before simulating."""
    cfg = observations.prepare(cfg)
    if cfg.task == catalogue.CUSTOM and cfg.code_dir is None and cfg.simulator is not None:
        from trainforge.workloads.sbi import sources

        sources.resolve(cfg)  # imports the user's modules, so their folder is known
        cfg = dataclasses.replace(cfg, code_dir=user_code.code_dir_of(cfg.simulator))
    users = [name for name in (cfg.estimator.model, cfg.estimator.embedding)
             if name is not None and user_code.is_import_path(name)]  # fmt: skip
    if cfg.code_dir is None and users:  # imported by check_data
        cfg = dataclasses.replace(cfg, code_dir=user_code.code_dir_of(users[0]))
    path = cfg.simulation.path
    if path is None:
        assert runner is not None, "simulations to make need the driver's stage runner"
        path = str(simulate.run(cfg, seed, storage_root, runner))
    simulations.check_invalid(Path(path), cfg.simulation.drop_invalid)
    log.say(f"simulations ready: {path}")
    return dataclasses.replace(cfg, simulation=dataclasses.replace(cfg.simulation, path=path))
