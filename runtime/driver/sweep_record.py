"""What a sweep keeps: the trials' table (``trials.csv`` in its run folder) and two figures
(the metric by trial, and each trial's settings as parallel coordinates coloured by the
metric), and on its MLflow run the same files, the best trial's metric and run (the best
trial's own run tagged as the sweep's best)."""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

from trainforge import log
from trainforge.atomic import replacing
from trainforge.config.sweep_space import Dimension, override_value
from trainforge.driver.sweep_console import FINISHED, Trial

TABLE = "trials.csv"
FIGURES = ("metric_by_trial.png", "parallel_coordinates.png")
BEST_TAG = "trainforge.sweep.best"


def best(trials: list[Trial], mode: str) -> Trial | None:
    """The finished trial with the best value of the sweep's metric."""
    done = [t for t in trials if t.state == FINISHED and t.value is not None]
    done = [t for t in done if math.isfinite(float(t.value or 0.0))]
    if not done:
        return None
    sign = 1.0 if mode == "min" else -1.0
    return min(done, key=lambda t: sign * float(t.value or 0.0))


def write(
    run_dir: Path, trials: list[Trial], dimensions: list[Dimension], metric: str, mode: str
) -> list[Path]:
    """The table and the figures in the sweep's folder; the files written."""
    keys = [d.key for d in dimensions]
    table = run_dir / TABLE
    with replacing(table) as temporary, open(temporary, "w", newline="") as stream:
        rows = csv.writer(stream)
        rows.writerow(["trial", "state", metric, "epochs", "seconds", *keys, "mlflow_run_id",
                       "reason"])  # fmt: skip
        for t in trials:
            settings = [override_value(t.settings[k]) if k in t.settings else "" for k in keys]
            rows.writerow([t.name, t.state, "" if t.value is None else t.value, t.epoch,
                           round(t.seconds, 2), *settings, t.run_id or "", t.reason])  # fmt: skip
    files = [table]
    try:
        files += _figures(run_dir, trials, dimensions, metric, mode)
    except Exception as exc:  # a figure never fails a sweep: the table has it all
        log.warn(f"could not draw the sweep's figures ({log.first_line(exc)})")
    return files


def log_to_mlflow(
    handle: Any, trials: list[Trial], metric: str, mode: str, files: list[Path]
) -> None:
    """The best trial and the files on the sweep's run; the best trial's run tagged."""
    from mlflow.tracking import MlflowClient

    if handle.run_id is None:
        return
    try:
        client = MlflowClient(tracking_uri=handle.tracking_uri)
        for state in {t.state for t in trials}:
            client.log_metric(handle.run_id, f"sweep/{state.replace(' ', '_')}",
                              float(sum(t.state == state for t in trials)))  # fmt: skip
        found = best(trials, mode)
        if found is not None and found.value is not None:
            client.log_metric(handle.run_id, f"best/{metric}", found.value)
            client.set_tag(handle.run_id, "sweep.best_trial", found.name)
            for key, value in found.settings.items():
                client.set_tag(handle.run_id, f"sweep.best.{key}", override_value(value))
            if found.run_id:
                client.set_tag(handle.run_id, "sweep.best_run_id", found.run_id)
                client.set_tag(found.run_id, BEST_TAG, "true")
        for file in files:
            client.log_artifact(handle.run_id, str(file), "sweep")
    except Exception as exc:  # tracking never fails a run
        log.warn(f"could not log the sweep to MLflow ({log.first_line(exc)})")


def end(handle: Any, status: str) -> None:
    from trainforge.tracking import driver as tracking

    tracking.finish_run(handle, status, None)


def _figures(
    run_dir: Path, trials: list[Trial], dimensions: list[Dimension], metric: str, mode: str
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    scored = [t for t in trials if t.value is not None and math.isfinite(t.value)]
    if not scored:
        return []
    index = [int(t.name.rsplit("-t", 1)[1]) for t in scored]
    values = [float(t.value) for t in scored]  # type: ignore[arg-type]
    colours = {"finished": "tab:blue", "stopped early": "tab:orange", "failed": "tab:red"}
    figure, axes = plt.subplots(figsize=(6, 3.5))
    for state, colour in colours.items():
        chosen = [(i, v) for i, v, t in zip(index, values, scored, strict=True) if t.state == state]
        if chosen:
            axes.scatter(*zip(*chosen, strict=True), color=colour, label=state)
    axes.set(xlabel="trial", ylabel=metric, title=f"{metric} by trial ({mode})")
    axes.legend()
    by_trial = run_dir / FIGURES[0]
    _save(figure, by_trial)
    plt.close(figure)

    figure, axes = plt.subplots(figsize=(1.8 * max(2, len(dimensions)) + 1, 3.5))
    low, high = min(values), max(values)
    colour_map = matplotlib.colormaps["viridis" if mode == "min" else "viridis_r"]  # best dark
    for trial, value in zip(scored, values, strict=True):
        shade = 0.5 if high == low else (value - low) / (high - low)
        ys = [_position(d, trial.settings.get(d.key)) for d in dimensions] + [shade]
        axes.plot(range(len(ys)), ys, "o-", color=colour_map(shade), alpha=0.8)
    axes.set_xticks(range(len(dimensions) + 1), [d.key for d in dimensions] + [metric])
    axes.set_yticks([0, 1], ["low", "high"])
    axes.set_title(f"each trial's settings and {metric} (darker: better)")
    coordinates = run_dir / FIGURES[1]
    _save(figure, coordinates)
    plt.close(figure)
    return [by_trial, coordinates]


def _position(dimension: Dimension, value: Any) -> float:
    """Where ``value`` lies in the dimension, 0 to 1 (log scale for loguniform; a choice by
    its place in the list)."""
    if value is None:
        return math.nan
    if dimension.kind == "choice":
        places = [override_value(v) for v in dimension.values]
        spot = places.index(override_value(value)) if override_value(value) in places else 0
        return spot / max(1, len(places) - 1)
    low, high = (float(v) for v in dimension.values)
    if dimension.kind == "loguniform":
        low, high, value = math.log(low), math.log(high), math.log(float(value))
    return 0.5 if high == low else (float(value) - low) / (high - low)


def _save(figure: Any, path: Path) -> None:
    with replacing(path) as temporary:
        figure.savefig(temporary, format="png", dpi=100, bbox_inches="tight")
