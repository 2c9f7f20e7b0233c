"""Figures logged as MLflow artifacts, drawn with matplotlib and written as SVG (MLflow's UI
shows SVG artifacts as images): the learning curve (the command, at the run's end) and the
confusion matrix (rank 0, after the loop). matplotlib's object-oriented API, not pyplot: no
global figure state, no GUI backend. Its import (about 0.45-0.55 s of this project's CPU) is
kept off the path to the run's end by ``preload``, called while training runs.
(The SBI workload's corner and rank plots are sbi's, ``workloads/sbi/calibration``.)"""

from __future__ import annotations

import importlib
import math
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

SERIES_COLOURS = {"train/loss": "tab:blue", "val/loss": "tab:orange", "val/accuracy": "tab:green"}
ANNOTATED_CLASSES = 20
"""Up to this many classes the matrix shows each count and each class's number."""


MATPLOTLIB = ("matplotlib.figure", "matplotlib.backends.backend_svg")
"""What the figures are drawn and written with (pyplot is none of it)."""


def preload() -> threading.Thread:
    """Import matplotlib's figure and SVG writer in a daemon thread: called where a process
    waits (the command while its workers train), so the figure at the run's end finds them."""
    thread = threading.Thread(target=_import_matplotlib, name="trainforge-plots", daemon=True)
    thread.start()
    return thread


def _import_matplotlib() -> None:
    for module in MATPLOTLIB:
        importlib.import_module(module)


def learning_curve(history: dict[str, list[tuple[int, float]]], path: Path) -> None:
    """``learning_curve_figure`` written to ``path`` as SVG."""
    _save(learning_curve_figure(history), path)


def learning_curve_figure(history: dict[str, list[tuple[int, float]]]) -> Figure:
    """Losses on the left axis, accuracy (when present) on the right, against optimizer step;
    validation points marked, values that are not finite left out."""
    from matplotlib.figure import Figure

    series = {
        key: sorted((step, value) for step, value in history.get(key, []) if math.isfinite(value))
        for key in SERIES_COLOURS
    }
    figure = Figure(figsize=(7.5, 4.2))  # 7.5 in: 720 px wide in a browser
    # fixed margins: tight_layout measures every label first, about half the drawing time
    right = 0.9 if series["val/accuracy"] else 0.97
    figure.subplots_adjust(left=0.1, right=right, top=0.92, bottom=0.24)
    loss_axis = figure.subplots()
    loss_axis.set_title("learning curve")
    loss_axis.set_xlabel("optimizer step")
    loss_axis.set_ylabel("loss")
    loss_axis.grid(True, color="0.9")
    for key in ("train/loss", "val/loss"):
        _plot(loss_axis, series[key], key, marker="o" if key == "val/loss" else None)
    axes = [loss_axis]
    if series["val/accuracy"]:
        accuracy_axis = loss_axis.twinx()
        accuracy_axis.set_ylabel("accuracy")
        _plot(accuracy_axis, series["val/accuracy"], "val/accuracy", marker="s")
        axes.append(accuracy_axis)
    handles = [line for axis in axes for line in axis.get_lines()]
    if handles:
        loss_axis.legend(handles=handles, loc="upper center", ncols=len(handles),
                         bbox_to_anchor=(0.5, -0.18), frameon=False)  # fmt: skip
    return figure


def _plot(axis: Axes, points: list[tuple[int, float]], key: str, marker: str | None) -> None:
    """One series; a lone point is always marked, as a line cannot show it."""
    if not points:
        return
    steps, values = zip(*points, strict=True)
    axis.plot(steps, values, color=SERIES_COLOURS[key], label=key, lw=1.5,
              marker=marker or ("o" if len(points) == 1 else None), ms=4)  # fmt: skip


def confusion_matrix(counts: np.ndarray, path: Path) -> None:
    """``confusion_matrix_figure`` written to ``path`` as SVG."""
    _save(confusion_matrix_figure(counts), path)


def confusion_matrix_figure(counts: np.ndarray) -> Figure:
    """Rows: true class, columns: predicted class, coloured by count (matplotlib's Blues);
    each count and class number written for up to ``ANNOTATED_CLASSES`` classes."""
    from matplotlib.figure import Figure

    classes = counts.shape[0]
    accuracy = np.trace(counts) / max(counts.sum(), 1)
    figure = Figure(figsize=(5.0, 4.4) if classes <= ANNOTATED_CLASSES else (8.0, 7.0))
    figure.subplots_adjust(left=0.1, right=0.98, top=0.92, bottom=0.1)
    axis = figure.subplots()
    image = axis.imshow(counts, cmap="Blues", vmin=0)
    figure.colorbar(image, ax=axis)
    axis.set_title(f"confusion matrix (accuracy {accuracy:.3f})")
    axis.set_xlabel("predicted")
    axis.set_ylabel("true")
    if classes <= ANNOTATED_CLASSES:
        axis.set_xticks(range(classes))
        axis.set_yticks(range(classes))
        peak = counts.max() if counts.size else 0
        size = 8 if classes <= 10 else 6
        for (row, column), count in np.ndenumerate(counts):
            colour = "white" if count > peak / 2 else "black"
            axis.text(column, row, str(int(count)), ha="center", va="center", color=colour,
                      fontsize=size)  # fmt: skip
    return figure


def _save(figure: Figure, path: Path) -> None:
    from matplotlib import rc_context

    # text as text (smaller files, readable by tests and search), the same ids on every save
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "trainforge"}):
        figure.savefig(path, format="svg")
