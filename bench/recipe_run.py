"""One `trainforge train` of a recipe inside a benchmark process, and the figures every SBI
benchmark reads from it."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any


def train_recipe(
    recipe: Path, name: str, storage: Path, overrides: list[str]
) -> tuple[Any, Any, dict[str, Any]]:
    """(resolved recipe, launch.Outcome, summary) of one run named ``name`` under ``storage``."""
    from trainforge import config
    from trainforge.driver import launch

    cfg = config.load(recipe, [f"run.name={name}", f"run.storage_path={storage}", *overrides])
    started = time.perf_counter()
    outcome = launch.train(cfg)
    summary = {
        "name": name,
        "overrides": overrides,
        "workers": outcome.num_workers,
        "exit_code": outcome.exit_code,
        "wall_s": time.perf_counter() - started,
        "samples_per_s": outcome.metrics.get("perf/samples_per_s"),
        "step_ms": outcome.metrics.get("perf/step_ms"),
        "val_loss": outcome.metrics.get("val/loss"),
        "epochs": outcome.metrics.get("epoch"),
    }
    return cfg, outcome, summary
