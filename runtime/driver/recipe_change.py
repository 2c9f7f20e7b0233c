"""A run resumed with another recipe is refused, naming what changed, before any worker starts.

Re-running a ``run.name`` resumes it; with a changed learning rate, batch, model or data that
would continue the old weights under new settings and report one MLflow run for two
experiments. So the resolved recipe is compared with the one saved in the run's latest valid
checkpoint (``recipe.yaml``, what those weights were trained with), key by key.
``checkpoint.allow_changes=true`` resumes anyway and prints the changes; the checkpoints written
from then on carry the new recipe.

Keys that cannot change what is computed pass silently (``PASS_ANY_CHANGE``), and so does
``train.epochs`` / ``train.max_steps`` extended (``PASS_WHEN_LARGER``; epochs to null, until
early stopping, too): the run goes on from
where it is (with a decaying LR schedule, the remaining steps follow the schedule recomputed
for the new length). Keys present in only one of the two recipes (a newer trainforge's new
setting) are not compared. Remote storage (``s3://…``) has no folder to read: not checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainforge import config, log, storage
from trainforge.config import Recipe
from trainforge.errors import RecipeError

PASS_ANY_CHANGE = (
    "train.log_every_steps",  # how often metrics are logged (the non-finite check rides along)
    "checkpoint.",  # cadence, how many are kept, resume, allow_changes
    "tracking.",  # where and what is recorded
    "run.max_failures",  # how often Ray Train restarts workers
    "scaling.timeout_s",  # how long a collective may hang before the run fails
    "sweep.",  # what `trainforge sweep` searches; a trial trains the recipe as written
    # where this machine keeps sbibm's files (a checked copy of the same pinned wheel)
    "workload.evaluation.sbibm_path",
)
"""Dotted keys (or prefixes ending in '.') that may change freely on resume."""

PASS_WHEN_LARGER = ("train.epochs", "train.max_steps")
"""Keys that may grow on resume: the run trains further."""


def check(
    cfg: Recipe,
    storage_root: str,
    verified: Path | None = None,
    free: tuple[str, ...] = (),
    only: tuple[str, ...] = ("",),
) -> None:
    """Refuse (RecipeError) a resume whose recipe differs from its latest checkpoint's in keys
    that change results, unless ``checkpoint.allow_changes``; then say what changed. That
    checkpoint is ``verified`` where the command has just checked it (``check_resumable``:
    hashing a large checkpoint's files twice would cost the command their read again), else
    it is searched for. Only keys under ``only`` are compared, less those under ``free``: the
    workload's are compared once its data is located."""
    folder = storage.local_folder(storage_root)
    if folder is None or not (folder / cfg.run.name).is_dir():
        return  # a new run (or remote storage): nothing to compare
    from trainforge import checkpoint

    latest = verified or checkpoint.newest_verified(folder / cfg.run.name)
    if latest is None:
        return
    from omegaconf import OmegaConf  # as written: not validated again, only compared

    saved: dict[str, Any] = OmegaConf.to_container(  # type: ignore[assignment]  # YAML keys
        OmegaConf.load(latest / checkpoint.RECIPE_FILE)
    )
    compare(cfg, saved, free, only)


def compare(
    cfg: Recipe, saved: Mapping[str, Any], free: tuple[str, ...] = (), only: tuple[str, ...] = ("",)
) -> None:
    """``check``'s verdict on ``cfg`` against the ``saved`` recipe of the run it resumes, on
    the keys under ``only``; keys under ``free`` may change too."""
    changed = {k: v for k, v in changes(saved, config.to_container(cfg)).items()
               if k.startswith(only) and not k.startswith(free)}  # fmt: skip
    if not changed:
        return
    listing = ", ".join(f"{key} {old!r} -> {new!r}" for key, (old, new) in changed.items())
    if not cfg.checkpoint.allow_changes:
        raise RecipeError(
            f"run.name: run {cfg.run.name!r} was trained with another recipe ({listing}); "
            "set checkpoint.allow_changes=true to resume it anyway, or pick a new run.name "
            "for a fresh run"
        )
    log.warn(f"resuming run {cfg.run.name!r} with a changed recipe: {listing}")


def changes(saved: Mapping[str, Any], current: Mapping[str, Any]) -> dict[str, tuple[Any, Any]]:
    """Keys present in both recipes whose values differ in a way that can change results:
    dotted key → (saved value, current value)."""
    old, new = flatten(saved), flatten(current)
    changed = {}
    for key in sorted(old.keys() & new.keys()):
        if old[key] == new[key] or key.startswith(PASS_ANY_CHANGE):
            continue
        if key in PASS_WHEN_LARGER and _grows(key, old[key], new[key]):
            continue
        changed[key] = (old[key], new[key])
    return changed


def flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and value:
            flat |= flatten(value, f"{prefix}{key}.")
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _grows(key: str, old: Any, new: Any) -> bool:
    """A larger number; or, for train.epochs, null (until early stopping: no limit). A null
    max_steps is not one: the length goes back to what epochs says."""
    if key == "train.epochs" and new is None:
        return isinstance(old, int)
    return isinstance(old, int) and isinstance(new, int) and new > old
