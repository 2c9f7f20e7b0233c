"""The run's figures, drawn by matplotlib: each series on its axis with the points the history
holds, each count in its cell, and SVG files that hold their text as text."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np

from trainforge.plots import (
    confusion_matrix,
    confusion_matrix_figure,
    learning_curve,
    learning_curve_figure,
)

SVG = "{http://www.w3.org/2000/svg}"


def _svg_texts(path: Path) -> list[str]:
    return ["".join(t.itertext()) for t in ET.parse(path).getroot().iter(SVG + "text")]


def test_the_learning_curve_draws_each_series_on_its_axis() -> None:
    train = [(10 * i, 2.0 / i) for i in range(1, 31)] + [(310, float("nan"))]
    val = [(200, 0.5), (100, 0.9), (300, float("inf")), (300, 0.3)]
    accuracy = [(100, 0.6), (200, 0.8), (300, 0.9)]
    figure = learning_curve_figure({"train/loss": train, "val/loss": val, "val/accuracy": accuracy})
    loss_axis, accuracy_axis = figure.axes
    lines = {line.get_label(): line for line in loss_axis.get_lines()}
    assert set(lines) == {"train/loss", "val/loss"}
    assert list(lines["train/loss"].get_xdata()) == [10 * i for i in range(1, 31)]  # nan: out
    assert list(lines["val/loss"].get_xdata()) == [100, 200, 300]  # sorted, inf: out
    assert list(lines["val/loss"].get_ydata()) == [0.9, 0.5, 0.3]
    assert lines["train/loss"].get_marker() == "None" and lines["val/loss"].get_marker() == "o"
    (accuracy_line,) = accuracy_axis.get_lines()  # the right axis: accuracy only
    assert list(accuracy_line.get_ydata()) == [0.6, 0.8, 0.9] and accuracy_line.get_marker() == "s"
    assert accuracy_axis.get_ylabel() == "accuracy" and loss_axis.get_ylabel() == "loss"
    assert loss_axis.get_xlabel() == "optimizer step" and loss_axis.get_title() == "learning curve"
    legend = loss_axis.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["train/loss", "val/loss", "val/accuracy"]


def test_a_curve_of_one_point_shows_a_mark_and_no_right_axis() -> None:
    figure = learning_curve_figure({"train/loss": [(5, 1.0)]})
    (axis,) = figure.axes
    (line,) = axis.get_lines()
    assert line.get_marker() == "o" and list(line.get_xdata()) == [5]


def test_the_learning_curve_is_an_svg_720_px_wide_with_its_text(tmp_path: Path) -> None:
    path = tmp_path / "curve.svg"
    learning_curve({"train/loss": [(1, 2.0), (2, 1.0)], "val/accuracy": [(2, 0.5)]}, path)
    root = ET.parse(path).getroot()
    assert root.attrib["width"] == "540pt"  # 7.5 in: 720 CSS px
    assert {"learning curve", "optimizer step", "loss", "accuracy", "val/accuracy"} <= set(
        _svg_texts(path)
    )


def test_the_confusion_matrix_shows_each_count_in_its_cell(tmp_path: Path) -> None:
    counts = np.diag([37, 32, 30])
    counts[1, 2] = 4
    figure = confusion_matrix_figure(counts)
    axis = figure.axes[0]
    (image,) = axis.get_images()
    assert np.array_equal(image.get_array(), counts)  # rows: true, columns: predicted
    assert image.get_cmap().name == "Blues"
    cells = {(t.get_position(), t.get_text()) for t in axis.texts}
    assert cells == {((j, i), str(counts[i, j])) for i in range(3) for j in range(3)}
    dark = {t.get_text() for t in axis.texts if t.get_color() == "white"}
    assert dark == {"37", "32", "30"}  # readable on the darkest cells
    assert axis.get_title() == f"confusion matrix (accuracy {99 / 103:.3f})"
    assert (axis.get_xlabel(), axis.get_ylabel()) == ("predicted", "true")
    path = tmp_path / "matrix.svg"
    confusion_matrix(counts, path)
    assert f"confusion matrix (accuracy {99 / 103:.3f})" in _svg_texts(path)


def test_a_thousand_classes_write_no_numbers_and_stay_small(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    counts = np.diag(np.full(1000, 40))
    counts[rng.integers(0, 1000, 3000), rng.integers(0, 1000, 3000)] += 1
    assert not confusion_matrix_figure(counts).axes[0].texts
    path = tmp_path / "matrix.svg"
    confusion_matrix(counts, path)
    assert path.stat().st_size < 1_000_000


def test_matplotlib_is_imported_by_the_preload_or_the_figure_not_by_the_module(
    tmp_path: Path,
) -> None:
    code = (
        "import sys; from trainforge import plots; "
        "print('matplotlib' in sys.modules); plots.preload().join(); "
        "print('matplotlib.figure' in sys.modules, "
        "'matplotlib.backends.backend_svg' in sys.modules, 'matplotlib.pyplot' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["False", "True True False"]


def test_the_warm_trackers_imports_hold_what_the_learning_curve_draws_with(
    tmp_path: Path,
) -> None:
    """The warm tracker imports at its start what a run's end draws the learning curve with:
    the curve imports no module of matplotlib's after it, and pyplot is never imported."""
    code = (
        "import importlib, sys\n"
        "from pathlib import Path\n"
        "from trainforge.driver import warm_tracker\n"
        "from trainforge.plots import learning_curve\n"
        "for module in warm_tracker.IMPORTS:\n"
        "    importlib.import_module(module)\n"
        "before = set(sys.modules)\n"
        "history = {'train/loss': [(1, 0.5), (2, 0.4)], 'val/accuracy': [(2, 0.9)]}\n"
        f"learning_curve(history, Path({str(tmp_path / 'curve.svg')!r}))\n"
        "print(sorted(m for m in set(sys.modules) - before if m.startswith('matplotlib')))\n"
        "print('matplotlib.pyplot' in sys.modules)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines() == ["[]", "False"]
    assert (tmp_path / "curve.svg").is_file()
