"""The sweep's live board (``driver/sweep_board.py``) on a real pseudo-terminal's screen: the
trials ended of the count and the best trials so far, ranked by the sweep's metric, redrawn as
Tune's callback hears of them; the sweep's lines above it, none glued to it; erased at the end,
leaving only the lines. No board where stdout is no terminal."""

from __future__ import annotations

import io
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import pytest

from tests.terminal import Terminal, frames, screen_of
from trainforge import log
from trainforge.driver import sweep_board
from trainforge.driver.sweep_console import TrialLines


@dataclass
class FakeTrial:
    """What TrialLines reads of Tune's trial."""

    name: str
    config: dict[str, Any]
    last_result: dict[str, Any] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.name

    @property
    def trial_id(self) -> str:
        return self.name


@pytest.fixture(autouse=True)
def _no_board_left() -> Any:
    yield
    sweep_board.close_drawn()
    log.write_around(None)


def _sweep(lines: TrialLines) -> None:
    one = FakeTrial("sw-t1", {"train.lr": 0.01})
    two = FakeTrial("sw-t2", {"train.lr": 0.1})
    three = FakeTrial("sw-t3", {"train.lr": 0.001})
    lines.on_trial_start(0, [], one)
    lines.on_trial_result(0, [], one, {"val/loss": 0.9, "epoch": 1})
    lines.on_trial_result(0, [], one, {"val/loss": 0.5, "epoch": 2})
    one.last_result = {"val/loss": 0.5, "epoch": 2, "trial/finished": 1}
    lines.on_trial_complete(0, [], one)
    lines.on_trial_start(0, [], two)
    lines.on_trial_result(0, [], two, {"val/loss": 0.7, "epoch": 1})
    two.last_result = {"val/loss": 0.7, "epoch": 1}
    lines.on_trial_complete(0, [], two)  # stopped early
    lines.on_trial_start(0, [], three)
    lines.on_trial_result(0, [], three, {"val/loss": 0.3, "epoch": 1})


@pytest.mark.parametrize("columns", [40, 80, 120])
def test_the_board_ranks_the_best_trials_below_the_lines_and_is_erased_at_the_end(
    columns: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    terminal = Terminal(columns)
    monkeypatch.setattr(sys, "stdout", terminal.file)
    lines = TrialLines("sw", "val/loss", "min", "/tmp/trials", total=4)
    _sweep(lines)
    sweep_board.close_drawn()
    written = terminal.close()  # all of it: the terminal's reader may lag behind the writes
    screen = screen_of(written, columns)
    last_board = [frame for frame in frames(written) if "ended" in frame][-1]

    assert "2/4 ended" in last_board and "1 running" in last_board
    shown = frames(written)
    ranked = [f for f in shown if "val/loss" in f and "at epoch" in f and "sweep:" not in f]
    assert (
        ranked[-3:]
        == [  # the last drawing of the rows: best first, each within the width
            "  t3 val/loss 0.3000 at epoch 1: train.lr=0.001"[: columns - 1],
            "  t1 val/loss 0.5000 at epoch 2: train.lr=0.01"[: columns - 1],
            "  t2 val/loss 0.7000 at epoch 1: train.lr=0.1"[: columns - 1],
        ]
    )
    # what stays: the lines a sweep without a terminal writes, in order, each starting a row of
    # its own (wrapped as the terminal wraps it), and nothing of the board
    plain = _plain_lines(monkeypatch)
    assert len(plain) == 8  # 3 starts, 2 ends, 3 new bests
    starts = [row for row in screen if row.startswith("[trainforge]")]
    assert len(starts) == len(plain), screen
    assert _words(screen) == _words(plain)


def _plain_lines(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    _sweep(TrialLines("sw", "val/loss", "min", "/tmp/trials", total=4))
    return out.getvalue().splitlines()


def _words(lines: list[str]) -> str:
    """The text with the terminal's wrapping undone: rows joined, spaces collapsed."""
    return re.sub(r"\s+", "", "".join(lines))


def test_no_board_where_stdout_is_no_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    lines = TrialLines("sw", "val/loss", "min", "/tmp/trials", total=4)
    _sweep(lines)
    assert lines.board is None and sweep_board._drawn is None
    assert "ended" not in out.getvalue()
    assert out.getvalue().count("[trainforge] sweep: ") == 8  # 3 starts, 2 ends, 3 new bests


def test_tune_keeps_the_callback_without_the_board(monkeypatch: pytest.MonkeyPatch) -> None:
    import pickle

    terminal = Terminal(80)
    monkeypatch.setattr(sys, "stdout", terminal.file)
    lines = TrialLines("sw", "val/loss", "min", "/tmp/trials", total=4)
    _sweep(lines)
    assert lines.board is not None
    kept = pickle.loads(pickle.dumps(lines))
    assert kept.board is None and kept.ended == 2 and set(kept.latest) == {"t1", "t2", "t3"}
    sweep_board.close_drawn()
    terminal.close()
