"""The run's figures, written as SVG without matplotlib: read back as XML, they hold what the
history and the counts say, where the axes put it."""

from __future__ import annotations

import itertools
import math
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from trainforge.plots import blue, confusion_matrix, learning_curve, nice_ticks, tick_label

SVG = "{http://www.w3.org/2000/svg}"


def _points(polyline: ET.Element) -> list[tuple[float, float]]:
    pairs = (pair.split(",") for pair in polyline.attrib["points"].split())
    return [(float(x), float(y)) for x, y in pairs]


def _by_colour(root: ET.Element, tag: str, colour: str, attribute: str) -> list[ET.Element]:
    return [e for e in root.iter(SVG + tag) if e.attrib.get(attribute) == colour]


@pytest.mark.parametrize(
    ("low", "high"), [(0.013, 2.31), (10, 330), (0.45, 0.99), (5, 5), (-3.2, 7.9), (0, 1e6)]
)
def test_nice_ticks_cover_the_range_in_round_even_steps(low: float, high: float) -> None:
    ticks = nice_ticks(low, high)
    steps = {round(b - a, 12) for a, b in itertools.pairwise(ticks)}
    assert ticks[0] <= low and ticks[-1] >= high and 3 <= len(ticks) <= 8, ticks
    assert len(steps) == 1, ticks
    (step,) = steps
    mantissa = step / 10 ** math.floor(math.log10(step))
    assert any(math.isclose(mantissa, m) for m in (1, 2, 5)), step


def test_tick_labels_have_the_decimals_their_spacing_needs() -> None:
    assert [tick_label(t, nice_ticks(0, 1)) for t in nice_ticks(0, 1)] == [
        "0.0", "0.2", "0.4", "0.6", "0.8", "1.0"
    ]  # fmt: skip
    assert [tick_label(t, nice_ticks(0, 330)) for t in nice_ticks(0, 330)] == [
        "0", "100", "200", "300", "400"
    ]  # fmt: skip


def test_the_learning_curve_draws_each_series_where_its_axis_puts_it(tmp_path: Path) -> None:
    train = [(10 * i, 2.0 / i) for i in range(1, 31)] + [(310, float("nan"))]
    val = [(100, 0.9), (200, 0.5), (300, float("inf")), (300, 0.3)]
    accuracy = [(100, 0.6), (200, 0.8), (300, 0.9)]
    path = tmp_path / "curve.svg"
    learning_curve({"train/loss": train, "val/loss": val, "val/accuracy": accuracy}, path)
    root = ET.parse(path).getroot()

    (train_line,) = _by_colour(root, "polyline", "#1f77b4", "stroke")
    (val_line,) = _by_colour(root, "polyline", "#ff7f0e", "stroke")
    (accuracy_line,) = _by_colour(root, "polyline", "#2ca02c", "stroke")
    assert len(_points(train_line)) == 30 and len(_points(val_line)) == 3  # not finite: left out
    train_xy = _points(train_line)
    assert all(a[0] < b[0] for a, b in itertools.pairwise(train_xy))  # later: right
    assert all(a[1] < b[1] for a, b in itertools.pairwise(train_xy))  # lower: down
    assert len(_by_colour(root, "circle", "#ff7f0e", "fill")) == 3  # a mark per validation
    assert len(_by_colour(root, "rect", "#2ca02c", "fill")) == 3
    # the same step, the same x, whichever axis: train's point at step 100 and val's first
    assert math.isclose(train_xy[9][0], _points(val_line)[0][0])
    # on the right axis, accuracy 0.9 is the highest point (smallest y)
    assert min(_points(accuracy_line), key=lambda p: p[1])[0] == _points(val_line)[-1][0]
    width, height = float(root.attrib["width"]), float(root.attrib["height"])
    assert all(0 <= x <= width and 0 <= y <= height for x, y in train_xy)
    texts = [t.text for t in root.iter(SVG + "text")]
    assert {"learning curve", "optimizer step", "loss", "accuracy", "val/accuracy"} <= set(texts)


def test_a_curve_of_one_point_shows_a_mark(tmp_path: Path) -> None:
    path = tmp_path / "curve.svg"
    learning_curve({"train/loss": [(5, 1.0)]}, path)
    root = ET.parse(path).getroot()
    assert not list(root.iter(SVG + "polyline"))
    assert len(_by_colour(root, "circle", "#1f77b4", "fill")) == 1
    assert "accuracy" not in [t.text for t in root.iter(SVG + "text")]  # no right axis


def _cells(root: ET.Element) -> list[ET.Element]:
    return [r for r in root.iter(SVG + "rect") if r.attrib["fill"].startswith("#")]


def test_the_confusion_matrix_shows_each_count_in_its_cell(tmp_path: Path) -> None:
    counts = np.diag([37, 32, 30])
    counts[1, 2] = 4
    path = tmp_path / "matrix.svg"
    confusion_matrix(counts, path)
    root = ET.parse(path).getroot()
    cells = _cells(root)
    assert len(cells) == 4  # the cells with counts; empty ones are the background
    darkest = min(cells, key=lambda r: int(r.attrib["fill"][1:3], 16))
    assert darkest.attrib["fill"] == blue(1.0)  # the largest count, (0, 0): top left
    assert float(darkest.attrib["x"]) < float(cells[-1].attrib["x"])
    in_cells = [t.text for t in root.iter(SVG + "text") if t.attrib["font-size"] == "8"]
    assert in_cells == [str(c) for c in counts.flatten()]  # row by row, zeros too
    title = next(root.iter(SVG + "text")).text
    assert title == f"confusion matrix (accuracy {99 / 103:.3f})"


def test_a_thousand_classes_draw_only_filled_cells_and_no_numbers(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    counts = np.diag(np.full(1000, 40))
    counts[rng.integers(0, 1000, 3000), rng.integers(0, 1000, 3000)] += 1
    path = tmp_path / "matrix.svg"
    confusion_matrix(counts, path)
    root = ET.parse(path).getroot()
    assert len(_cells(root)) == np.count_nonzero(counts)
    texts = [t.text for t in root.iter(SVG + "text")]  # the title, axes, colour bar's ends
    assert len(texts) == 5 and texts[-1] == "0" and texts[-2] == str(counts.max())
    assert float(root.attrib["width"]) <= 800 and path.stat().st_size < 1_000_000


def test_drawing_both_figures_imports_no_matplotlib(tmp_path: Path) -> None:
    code = (
        "import sys, numpy as np; from pathlib import Path; "
        "from trainforge.plots import learning_curve, confusion_matrix; "
        f"folder = Path({str(tmp_path)!r}); "
        "learning_curve({'train/loss': [(1, 2.0), (2, 1.0)]}, folder / 'a.svg'); "
        "confusion_matrix(np.eye(3, dtype=int), folder / 'b.svg'); "
        "print('matplotlib' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert (tmp_path / "a.svg").is_file() and (tmp_path / "b.svg").is_file()
