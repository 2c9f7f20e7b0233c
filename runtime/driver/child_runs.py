"""What a command that runs other runs shares (an SBI ensemble's members, a sweep's trials):
each is the `trainforge train` a user would start by hand, in a process of its own, on this
command's Ray cluster, its MLflow run nested under this command's."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trainforge import config, log, settings
from trainforge.atomic import replacing
from trainforge.config import Recipe
from trainforge.config.resolve import worker_resources
from trainforge.driver.local_cluster import on_lasting_cluster
from trainforge.tracking.client import redact_all

RECIPE_FILE = "recipe.yaml"  # the recipe the runs are trained with


def runs_at_once(cfg: Recipe, cluster: dict[str, float], count: int) -> int:
    """How many of ``count`` runs of ``cfg`` the cluster holds at once: each needs its
    workers' resources."""
    run = config.resolve_workers(cfg, cluster).scaling
    use_gpu = run.use_gpu == "true"
    need = {k: v * run.num_workers for k, v in worker_resources(run, use_gpu).items()}
    fits = [int(cluster.get(k, 0) // v) for k, v in need.items() if v > 0]
    return max(1, min([count, *fits]))


def child_env(parent_run_id: str | None, ray: Any) -> dict[str, str]:
    """The runs' environment: this command's, the MLflow parent run, and this command's Ray
    cluster (a private one or RAY_ADDRESS's: they join it rather than starting their own; the
    lasting local cluster they join by themselves, with its warm workers)."""
    env = dict(os.environ)
    if parent_run_id:
        env[settings.PARENT_RUN.name] = parent_run_id
    if not on_lasting_cluster() and "RAY_ADDRESS" not in env:
        env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    env.setdefault("PYTHONUNBUFFERED", "1")  # their lines as they come
    return env


def loudness() -> list[str]:
    """This command's -q / -v, for the runs' commands."""
    return {-1: ["-q"], 0: [], 1: ["-v"]}[max(-1, min(1, log.verbosity()))]


def check_recipe(cfg: Recipe, run_dir: Path, free: tuple[str, ...]) -> None:
    """A re-run keeps the runs that finished, so it must be the recipe they were trained with
    (``recipe_change``'s rules; the keys in ``free`` may change too). The recipe is saved when
    the command first starts."""
    from omegaconf import OmegaConf

    from trainforge.driver import recipe_change

    saved_file = run_dir / RECIPE_FILE
    if saved_file.is_file():
        saved: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(saved_file))  # type: ignore[assignment]
        recipe_change.compare(cfg, saved, free=free)
        if not cfg.checkpoint.allow_changes:
            return
    run_dir.mkdir(parents=True, exist_ok=True)
    with replacing(saved_file) as temporary:
        temporary.write_text(redact_all(config.to_yaml(cfg)))
