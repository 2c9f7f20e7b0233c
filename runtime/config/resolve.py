"""The one step that fills in what a recipe leaves to the driver, once it knows the cluster.

A loaded recipe may say ``use_gpu: auto``, ``use_all_gpus: true`` or leave an SBI recipe's
simulations to be made; the driver connects to Ray, then calls :func:`resolve` once and runs,
logs and checkpoints the recipe it returns. Checks never write; only this step does, and it
returns a new recipe instead of changing the one it was given. It has two halves, which the
driver calls apart to start its workers in between: :func:`resolve_workers` (how many, on what
device; quick) and :func:`resolve_data` (the SBI simulation stage may take minutes).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from trainforge.config.schema import Recipe, ScalingSection, check_batch_fits
from trainforge.errors import RecipeError


def resolve(
    cfg: Recipe, available: Mapping[str, float], storage_root: str, runner: Any = None
) -> Recipe:
    """``cfg`` with the worker count and device decided for the cluster's ``available``
    resources (``ray.cluster_resources()``), and the workload's data made and located (the SBI
    simulation stage runs here, on the driver's stage ``runner``). Raises RecipeError when the
    cluster cannot host the run."""
    return resolve_data(resolve_workers(cfg, available), storage_root, runner)


def resolve_workers(
    cfg: Recipe, available: Mapping[str, float], where: str = "the Ray cluster"
) -> Recipe:
    """``cfg`` with the worker count and device decided, checked before any data are made.
    ``where``: what offers ``available``, as a refusal names it ("this machine" for a command
    whose workers are its own processes)."""
    from trainforge.workloads import train_samples  # the registry

    graphs = cfg.precision.cuda_graphs == "true"  # auto falls back to eager in the worker
    scaling = resolve_scaling(cfg.scaling, available, graphs, where)
    # before the data stage (which may simulate for minutes), with the recipe's sizes…
    check_batch_fits(cfg.train, scaling.num_workers, train_samples(cfg.workload))
    return dataclasses.replace(cfg, scaling=scaling)


def resolve_data(cfg: Recipe, storage_root: str, runner: Any = None) -> Recipe:
    """``cfg`` (workers resolved) with the workload's data made and located (its stage's work
    run by the driver's ``runner``, a ``workloads.stage.StageRunner``)."""
    from trainforge.workloads import resolve_workload, train_samples  # the registry

    workload = resolve_workload(cfg.workload, cfg.run.seed, storage_root, runner)
    # …and after it, with the data it made (an SBI run may drop invalid simulations)
    check_batch_fits(cfg.train, cfg.scaling.num_workers, train_samples(workload))
    return dataclasses.replace(cfg, workload=workload)


def resolve_scaling(
    scaling: ScalingSection,
    available: Mapping[str, float],
    cuda_graphs: bool = False,
    where: str = "the Ray cluster",
) -> ScalingSection:
    """``num_workers`` (from ``use_all_gpus``) and ``use_gpu`` (``auto`` → true or false) for
    this cluster, after checking that it can host the workers."""
    gpus = available.get("GPU", 0)
    num_workers = scaling.num_workers
    if scaling.use_all_gpus:
        if gpus < 1 or scaling.use_gpu == "false":
            raise RecipeError(f"scaling.use_all_gpus: true, but {where} has no GPU to use")
        per_worker = scaling.resources_per_worker.get("GPU", 1)
        if per_worker <= 0 or gpus < per_worker:
            raise RecipeError(
                f"scaling.use_all_gpus: each worker asks for {per_worker:g} GPU "
                f"(scaling.resources_per_worker.GPU) and {where} has {gpus:g}"
            )
        num_workers = int(gpus // per_worker)
    if scaling.use_gpu == "true" and gpus == 0:
        raise RecipeError(f"scaling.use_gpu: true, but {where} has no GPU")
    use_gpu = scaling.use_gpu == "true" or (scaling.use_gpu == "auto" and gpus > 0)
    if cuda_graphs and not use_gpu:
        raise RecipeError(
            "precision.cuda_graphs: needs GPU workers (CUDA graphs), and these would run on CPU"
        )
    for resource, amount in worker_resources(scaling, use_gpu).items():
        need, have = amount * num_workers, available.get(resource, 0)
        if need > have:
            raise RecipeError(
                f"scaling.num_workers: {num_workers} workers × {amount:g} {resource} "
                f"need {need:g} {resource}, but {where} has {have:g}"
            )
    return dataclasses.replace(
        scaling, num_workers=num_workers, use_gpu="true" if use_gpu else "false"
    )


def worker_resources(scaling: ScalingSection, use_gpu: bool) -> dict[str, float]:
    """Ray resources each worker reserves: the recipe's, with 1 CPU (+1 GPU) by default."""
    resources = dict(scaling.resources_per_worker)
    resources.setdefault("CPU", 1)
    if use_gpu:
        resources.setdefault("GPU", 1)
    return resources
