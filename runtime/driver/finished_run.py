"""A run with nothing left to train says so at once: no worker starts, nothing is written.

Without this, the same command again on a finished run started workers, evaluated the model
once more, wrote another checkpoint of the same weights and said "resuming at epoch 16 step
330" (5.9 s with warm workers on this project's 2-core CPU; an SBI run's evaluation again on
top). So the command that finishes a run writes ``finished.json`` in the run's folder: the
checkpoint it ended with, the recipe it was given (credentials hidden), its final metrics and
its MLflow run. A later command prints that outcome again and exits 0 when

- its recipe is the one recorded, up to keys that cannot change what is computed
  (``recipe_change.PASS_ANY_CHANGE``), and
- the run's newest valid checkpoint is still the one recorded.

Anything else takes the usual path: a longer ``train.epochs`` / ``train.max_steps`` trains
further, another change is refused or resumed with ``checkpoint.allow_changes``, a newer
checkpoint (a later command trained on) resumes. Remote storage (``s3://…``) keeps no record
here: its runs take the usual path. The recipe is compared as the command was given it, before
``auto`` is resolved: the same request on the same run has nothing left to do.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from trainforge import config, log
from trainforge.atomic import replacing
from trainforge.config import Recipe
from trainforge.driver import recipe_change

FILE = "finished.json"


def requested(cfg: Recipe) -> dict[str, Any]:
    """The recipe as the command was given it, as the record keeps it: no credentials."""
    from omegaconf import OmegaConf

    from trainforge.tracking.client import redact_all

    kept: dict[str, Any] = OmegaConf.to_container(  # type: ignore[assignment]  # YAML keys
        OmegaConf.create(redact_all(config.to_yaml(cfg)))
    )
    return kept


def record(run_dir: Path, recipe: dict[str, Any], outcome: Any) -> None:
    """Write down that the run in ``run_dir``, given ``recipe``, finished with ``outcome``
    (``run.Outcome``; no checkpoint: nothing to resume from, nothing is written)."""
    if outcome.checkpoint_path is None or not run_dir.is_dir():
        return
    from trainforge.tracking.client import redact

    uri = outcome.tracking_uri
    entry = {
        "checkpoint": Path(outcome.checkpoint_path).name,
        "recipe": recipe,
        "metrics": {k: v for k, v in outcome.metrics.items() if isinstance(v, (int, float, str))},
        "mlflow_run_id": outcome.mlflow_run_id,
        "tracking_uri": redact(uri) if uri else None,
        "finished_at": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    try:
        with replacing(run_dir / FILE) as temporary:
            temporary.write_text(json.dumps(entry, indent=1) + "\n")
    except OSError as exc:  # the run is done and kept: only its next command's shortcut is lost
        log.warn(f"could not write {run_dir / FILE} ({exc.strerror or exc})")


def nothing_left(
    run_dir: Path | None, request: dict[str, Any], newest: Path | None
) -> dict[str, Any] | None:
    """The record (``record``'s keys) when the run in ``run_dir`` (None: remote storage) has
    nothing left to train for the recipe ``request`` (``requested``) and its newest valid
    checkpoint is ``newest``; else None: the command goes on as usual."""
    if run_dir is None or newest is None:
        return None
    try:
        entry = json.loads((run_dir / FILE).read_text())
        if entry["checkpoint"] != newest.name:
            return None  # trained on since (or that checkpoint is gone)
        if not same_request(entry["recipe"], request):
            return None
        return {**entry, "metrics": dict(entry["metrics"])}  # a record of another shape: None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None  # no record, or one not readable: the usual path decides


def same_request(saved: dict[str, Any], current: dict[str, Any]) -> bool:
    """The same recipe up to keys that change nothing computed: a longer run is another one."""
    if recipe_change.changes(saved, current):
        return False
    old, new = recipe_change.flatten(saved), recipe_change.flatten(current)
    return all(old.get(key) == new.get(key) for key in recipe_change.PASS_WHEN_LARGER)
