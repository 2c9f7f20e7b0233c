"""Figures logged as MLflow artifacts, written as SVG: a learning curve and a confusion matrix
are lines, squares and text. matplotlib drew them before, and its import (0.3-0.6 s of this
project's CPU) sat on a cold command's way to its end, twice: in the command (the learning
curve) and in rank 0 (the confusion matrix). MLflow's UI shows SVG artifacts as images.
(The SBI workload's corner and rank plots still use matplotlib, ``workloads/sbi/calibration``.)"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from xml.sax.saxutils import escape

import numpy as np

SERIES_COLOURS = {"train/loss": "#1f77b4", "val/loss": "#ff7f0e", "val/accuracy": "#2ca02c"}
# matplotlib's "Blues" at its ends and middle: few counts pale, many counts dark
BLUES = ((247, 251, 255), (107, 174, 214), (8, 48, 107))
FONT = 'font-family="DejaVu Sans, Arial, sans-serif"'


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round values, 1, 2 or 5 × 10^k apart (the one nearest an even split),
    from at or below ``low`` to at or above ``high``."""
    if high <= low:  # one value: a small span around it
        span = abs(low) * 0.1 or 1.0
        low, high = low - span, high + span
    raw = (high - low) / max(count - 1, 1)
    magnitude = 10.0 ** math.floor(math.log10(raw))
    fraction = raw / magnitude
    step = magnitude * next(m for limit, m in ((1.5, 1), (3, 2), (7, 5), (math.inf, 10))
                            if fraction < limit)  # fmt: skip
    first = math.floor(low / step + 1e-9) * step
    intervals = math.ceil((high - first) / step - 1e-9)
    return [first + i * step for i in range(intervals + 1)]


def tick_label(value: float, ticks: Sequence[float]) -> str:
    """``value`` with as many decimals as the ticks' spacing needs (0.25, not 0.25000000001)."""
    step = ticks[1] - ticks[0] if len(ticks) > 1 else 1.0
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    return f"{value:.{decimals}f}"


def _scale(low: float, high: float, to_low: float, to_high: float) -> Callable[[float], float]:
    return lambda value: to_low + (value - low) / (high - low) * (to_high - to_low)


def _text(x: float, y: float, text: str, size: int = 11, anchor: str = "middle",
          extra: str = "") -> str:  # fmt: skip
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" {FONT} '
            f'{extra}>{escape(text)}</text>')  # fmt: skip


def _rect(x: float, y: float, width: float, height: float, fill: str = "none",
          extra: str = "") -> str:  # fmt: skip
    return (f'<rect x="{x:.2f}" y="{y:.2f}" width="{width:.2f}" height="{height:.2f}" '
            f'fill="{fill}" {extra}/>')  # fmt: skip


def _line(x1: float, y1: float, x2: float, y2: float, stroke: str, width: float = 1) -> str:
    return (f'<line x1="{x1:.2f}" y1="{y1:.2f}" x2="{x2:.2f}" y2="{y2:.2f}" stroke="{stroke}" '
            f'stroke-width="{width}"/>')  # fmt: skip


def _svg(width: int, height: int, parts: list[str], path: Path) -> None:
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
            f'viewBox="0 0 {width} {height}">')  # fmt: skip
    body = [head, f'<rect width="{width}" height="{height}" fill="white"/>', *parts, "</svg>"]
    path.write_text("\n".join(body) + "\n")


def learning_curve(history: dict[str, list[tuple[int, float]]], path: Path) -> None:
    """Losses on the left axis, accuracy (when present) on the right, against optimizer step.
    Values that are not finite are left out."""
    series = {
        key: sorted((step, value) for step, value in history.get(key, []) if math.isfinite(value))
        for key in SERIES_COLOURS
    }
    losses = [value for key in ("train/loss", "val/loss") for _, value in series[key]]
    accuracy = series["val/accuracy"]
    steps = [step for points in series.values() for step, _ in points] or [0]
    width, height = 720, 400
    left, right, top, bottom = 70, 70 if accuracy else 20, 56, 50
    x0, x1, y0, y1 = left, width - right, top, height - bottom  # the plot's box
    x_ticks = nice_ticks(min(steps), max(steps))
    loss_ticks = nice_ticks(min(losses), max(losses)) if losses else [0.0, 1.0]
    x = _scale(x_ticks[0], x_ticks[-1], x0, x1)
    y = _scale(loss_ticks[0], loss_ticks[-1], y1, y0)
    parts = [_text(width / 2, 22, "learning curve", size=14)]
    for tick in x_ticks:
        parts.append(_line(x(tick), y1, x(tick), y1 + 5, "black"))
        parts.append(_text(x(tick), y1 + 18, tick_label(tick, x_ticks)))
    for tick in loss_ticks:
        parts.append(_line(x0, y(tick), x1, y(tick), "#e5e5e5"))
        parts.append(_text(x0 - 8, y(tick) + 4, tick_label(tick, loss_ticks), anchor="end"))
    parts.append(_text((x0 + x1) / 2, height - 12, "optimizer step"))
    parts.append(
        _text(18, (y0 + y1) / 2, "loss", extra=f'transform="rotate(-90 18 {(y0 + y1) / 2})"')
    )
    for key in ("train/loss", "val/loss"):
        parts += _series(series[key], x, y, SERIES_COLOURS[key], marker=key == "val/loss")
    if accuracy:
        values = [value for _, value in accuracy]
        acc_ticks = nice_ticks(min(values), max(values))
        y_acc = _scale(acc_ticks[0], acc_ticks[-1], y1, y0)
        for tick in acc_ticks:
            parts.append(
                _text(x1 + 8, y_acc(tick) + 4, tick_label(tick, acc_ticks), anchor="start")
            )
        parts += _series(
            accuracy, x, y_acc, SERIES_COLOURS["val/accuracy"], marker=True, square=True
        )
        middle = (y0 + y1) / 2
        parts.append(_text(width - 14, middle, "accuracy",
                           extra=f'transform="rotate(90 {width - 14} {middle})"'))  # fmt: skip
    parts.append(_rect(x0, y0, x1 - x0, y1 - y0, extra='stroke="black"'))
    shown = [key for key in SERIES_COLOURS if series[key]]
    legend_x = (x0 + x1) / 2 - 65 * len(shown)  # the legend: one row between title and box
    for column, key in enumerate(shown):
        line_x = legend_x + 130 * column
        parts.append(_line(line_x, y0 - 12, line_x + 24, y0 - 12, SERIES_COLOURS[key], 2))
        parts.append(_text(line_x + 30, y0 - 8, key, anchor="start"))
    _svg(width, height, parts, path)


def _series(points: list[tuple[int, float]], x: Callable[[float], float],
            y: Callable[[float], float], colour: str, marker: bool,
            square: bool = False) -> list[str]:  # fmt: skip
    """One series: a line through its points, and a mark on each where ``marker`` (or where
    it has one point, which a line cannot show)."""
    if not points:
        return []
    xy = [(x(step), y(value)) for step, value in points]
    parts = []
    if len(xy) > 1:
        line = " ".join(f"{px:.1f},{py:.1f}" for px, py in xy)
        parts.append(
            f'<polyline points="{line}" fill="none" stroke="{colour}" stroke-width="1.5"/>'
        )
    if marker or len(xy) == 1:
        for px, py in xy:
            if square:
                parts.append(_rect(px - 3, py - 3, 6, 6, colour))
            else:
                parts.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="3" fill="{colour}"/>')
    return parts


def blue(fraction: float) -> str:
    """The colour of a cell holding ``fraction`` of the largest count."""
    fraction = min(max(fraction, 0.0), 1.0)
    low, high, part = (BLUES[0], BLUES[1], fraction * 2) if fraction <= 0.5 else (
        BLUES[1], BLUES[2], fraction * 2 - 1)  # fmt: skip
    return "#" + "".join(f"{round(a + (b - a) * part):02x}" for a, b in zip(low, high, strict=True))


def confusion_matrix(counts: np.ndarray, path: Path) -> None:
    """Rows: true class, columns: predicted class; cells annotated for up to 20 classes. Only
    cells with counts are drawn (empty ones are the background), so the file grows with what
    the validation set can fill, not with the square of the classes."""
    classes = counts.shape[0]
    cell = min(32.0, 640 / max(classes, 1))  # pixels: the matrix is at most 640 wide
    side = cell * classes
    left, top = 60, 50
    width, height = max(round(left + side + 100), 360), round(top + side + 50)
    peak = int(counts.max()) if counts.size else 0
    accuracy = np.trace(counts) / max(counts.sum(), 1)
    parts = [_text(width / 2, 24, f"confusion matrix (accuracy {accuracy:.3f})", size=14)]
    for i, j in zip(*np.nonzero(counts), strict=True):
        parts.append(_rect(left + j * cell, top + i * cell, cell, cell, blue(counts[i, j] / peak)))
    if classes <= 20:
        for i in range(classes):
            for j in range(classes):
                colour = "white" if counts[i, j] > peak / 2 else "black"
                centre = (left + (j + 0.5) * cell, top + (i + 0.5) * cell + 3)
                parts.append(_text(*centre, str(int(counts[i, j])), size=8,
                                   extra=f'fill="{colour}"'))  # fmt: skip
            parts.append(_text(left + (i + 0.5) * cell, top + side + 14, str(i), size=9))
            parts.append(_text(left - 6, top + (i + 0.5) * cell + 3, str(i), size=9, anchor="end"))
    parts.append(_rect(left, top, side, side, extra='stroke="black"'))
    parts.append(_text(left + side / 2, height - 12, "predicted"))
    middle = top + side / 2
    parts.append(_text(22, middle, "true", extra=f'transform="rotate(-90 22 {middle})"'))
    bar_x = left + side + 24  # the colour bar: 0 at the bottom, the largest count at the top
    parts.append('<defs><linearGradient id="blues" x1="0" y1="1" x2="0" y2="0">'
                 + "".join(f'<stop offset="{f}" stop-color="{blue(f)}"/>' for f in (0, 0.5, 1))
                 + "</linearGradient></defs>")  # fmt: skip
    parts.append(_rect(bar_x, top, 14, side, "url(#blues)", 'stroke="black"'))
    parts.append(_text(bar_x + 20, top + 8, str(peak), size=9, anchor="start"))
    parts.append(_text(bar_x + 20, top + side, "0", size=9, anchor="start"))
    _svg(width, height, parts, path)
