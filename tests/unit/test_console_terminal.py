"""The progress bar on a real terminal's screen: a pseudo-terminal 60, 80 and 120 columns wide,
what was written to it rendered by a terminal emulator (``tests/terminal.py``). The bar never
leaves a stale line, fits the width, ends at 100 %, and every line written during the run or
after it (the workers' lines, the command's warnings, the closing table, the Ctrl-C line)
starts on a clean line of its own. Once through a real ``trainforge train``."""

from __future__ import annotations

import contextlib
import io
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from tests.terminal import Terminal, frames, run_in_terminal, screen_of
from trainforge import log
from trainforge.checkpoint import Position
from trainforge.distributed import WorkerContext
from trainforge.driver import console
from trainforge.driver.run import INTERRUPTED
from trainforge.progress import Progress

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "recipes" / "cnn" / "digits_simple_cnn.yaml"
STEPS, EPOCHS, LOG_EVERY = 66, 3, 10  # 22 steps an epoch: the last step is no logging step


@pytest.fixture(autouse=True)
def normal_verbosity() -> Iterator[None]:
    log.set_verbosity(0)
    yield
    log.set_verbosity(0)


def rank_0_output(until_step: int = STEPS) -> list[str]:
    """What rank 0 writes for a run of ``STEPS`` steps over ``EPOCHS`` epochs, logging every
    ``LOG_EVERY`` steps, up to ``until_step`` (the whole run: its finish too), one string a
    line."""
    ctx = WorkerContext(rank=0, local_rank=0, world_size=2, node_rank=0, device=torch.device("cpu"))
    written = io.StringIO()
    per_epoch = STEPS // EPOCHS
    with contextlib.redirect_stdout(written):
        progress = Progress(ctx, STEPS, EPOCHS, 64, {"model": "simple_cnn"})
        progress.start(Position())
        for step in range(1, until_step + 1):
            epoch = (step - 1) // per_epoch
            if step % LOG_EVERY == 0:
                metrics = progress.step_metrics(Position(epoch, 0, step), LOG_EVERY)
                metrics |= {"train/loss": 1 / step, "train/lr": 1e-3}
                progress.log_step(Position(epoch, 0, step), metrics)
            if step % per_epoch == 0:
                progress.log_epoch(epoch, {"train/loss": 0.5, "val/loss": 0.25})
        if until_step == STEPS:
            progress.finish(Position(EPOCHS, 0, STEPS))
    return written.getvalue().splitlines()


@contextlib.contextmanager
def on(terminal: Terminal, monkeypatch: pytest.MonkeyPatch) -> Iterator[console.Console]:
    """The driver's console and the command's own stdout and stderr on ``terminal``."""
    monkeypatch.setattr(log, "_warned", set())  # each test's warnings said anew
    monkeypatch.setattr(sys, "stdout", terminal.file)
    monkeypatch.setattr(sys, "stderr", terminal.file)
    yield console.Console(None, terminal.file)


def relay(shown: console.Console, line: str, is_err: bool = False) -> None:
    shown.handle({"lines": [line], "is_err": is_err, "pid": 7, "actor_name": "RayTrainWorker"})


def is_bar(text: str) -> bool:
    return text.startswith("epoch ") and f"/{STEPS}" in text


def bar_rows(screen: list[str]) -> list[str]:
    return [row for row in screen if is_bar(row)]


def lines_from(screen: list[str], row: int) -> list[str]:
    """The lines that begin at ``row`` or below (a line wider than the terminal goes on in
    the rows after its first: those are left out)."""
    return [line for line in screen[row:] if line.startswith("[trainforge]")]


def check_frames(written: bytes, columns: int) -> None:
    """Every frame of the bar fits the terminal's width (a wider one wraps, and its redraw
    leaves the wrapped part behind), and no event reached the screen as raw text."""
    drawn = [frame for frame in frames(written) if is_bar(frame)]
    assert len(drawn) >= 3, drawn  # redrawn in place as the steps came
    assert all(len(frame.rstrip()) <= columns for frame in drawn), [
        (len(frame), frame) for frame in drawn if len(frame.rstrip()) > columns
    ]
    assert b"trainforge:progress" not in written and b'"kind"' not in written


@pytest.mark.parametrize(("columns", "sized"), [(60, True), (80, True), (120, True), (80, False)])
def test_the_bar_holds_on_a_terminal_of_any_width(
    columns: int, sized: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also on a terminal that tells no size (0×0): drawn 80 columns wide, not left out."""
    terminal = Terminal(columns, sized)
    with on(terminal, monkeypatch) as shown:
        lines = rank_0_output()
        for index, line in enumerate(lines):
            relay(shown, line)
            if index == 3:  # mid-run: a worker's warning, then one of the command's own
                relay(shown, "[trainforge] warning: loss scale dropped", is_err=True)
                log.warn("the tracking server is slow to answer")
        shown.close()
        console.summary("demo", {"epoch": 3, "train/loss": 0.25}, None, None)
    written = terminal.close()
    screen = screen_of(written, columns)
    check_frames(written, columns)
    bars = bar_rows(screen)
    assert len(bars) == 1, "\n".join(screen)  # no stale frame left on the screen
    at = screen.index(bars[0])
    assert bars[0].startswith("epoch 3/3 100%|") and f"| {STEPS}/{STEPS} [" in bars[0], bars[0]
    # the lines said during the run are above the bar, each on a row of its own
    above = screen[:at]
    for said in ("[trainforge] warning: loss scale dropped",
                 "[trainforge] warning: the tracking server is slow to answer",
                 "[trainforge] epoch 1/3 done: train/loss 0.5000 val/loss 0.2500",
                 "[trainforge] epoch 3/3 done: train/loss 0.5000 val/loss 0.2500"):  # fmt: skip
        assert any(row.startswith(said[:columns]) for row in above), (said, screen)
    # after it, each on a clean line: the run's last line, then the closing table
    assert "[trainforge]" not in bars[0]  # nothing glued to it
    below = lines_from(screen, at + 1)
    assert below[0].startswith(f"[trainforge] finished at step {STEPS} in "), screen
    assert below[1].startswith("[trainforge] run 'demo' finished in "), screen
    assert below[2].split() == ["[trainforge]", "epoch", "3"], screen


@pytest.mark.parametrize("columns", [60, 120])
def test_a_ctrl_c_line_starts_below_the_bar(columns: int, monkeypatch: pytest.MonkeyPatch) -> None:
    terminal = Terminal(columns)
    with on(terminal, monkeypatch) as shown:
        for line in rank_0_output(until_step=45):
            relay(shown, line)
        shown.close()  # what the command does at a Ctrl-C, before it says so
        log.say(INTERRUPTED)
    screen = terminal.screen()
    bars = bar_rows(screen)
    assert len(bars) == 1 and f" 40/{STEPS} [" in bars[0], screen  # where the run stopped
    assert "[trainforge]" not in bars[0]
    at = screen.index(bars[0])
    assert screen[at + 1] == f"[trainforge] {INTERRUPTED}"[:columns], screen


@pytest.mark.slow
def test_a_real_run_in_a_terminal(tmp_path: Path) -> None:
    """``trainforge train`` of the digits recipe on its own worker processes, in an 80-column
    terminal: 66 steps logged every 10, so the last step is no logging step."""
    columns = 80
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(TRAINFORGE_WORKERS="own")
    code, screen, written = run_in_terminal(
        [sys.executable, "-m", "trainforge", "train", str(DIGITS), "run.name=tty",
         f"train.max_steps={STEPS}", f"train.log_every_steps={LOG_EVERY}",
         "tracking.enabled=false"],
        columns, cwd=tmp_path, env=env,
    )  # fmt: skip
    shown = "\n".join(screen)
    assert code == 0, shown
    check_frames(written, columns)
    bars = bar_rows(screen)
    assert len(bars) == 1, shown
    assert bars[0].startswith(f"epoch {EPOCHS}/{EPOCHS} 100%|") and f" {STEPS}/{STEPS} [" in bars[0]
    assert "[trainforge]" not in bars[0]
    below = lines_from(screen, screen.index(bars[0]) + 1)
    assert below[0].startswith(f"[trainforge] finished at step {STEPS} in "), shown
    assert below[1].startswith("[trainforge] run 'tty' finished in "), shown
    # the run folder's log reads plain lines, not events
    kept = (tmp_path / "runs" / "tty" / "worker-output.log").read_text()
    assert f"[trainforge] epoch 1/{EPOCHS} step 10/{STEPS} loss " in kept
    assert "trainforge:progress" not in kept


def test_a_restarted_attempt_gets_one_new_bar(monkeypatch: pytest.MonkeyPatch) -> None:
    """A restart resumes from its last checkpoint, behind the bar: the old bar goes, the new
    one starts where the attempt resumes and ends at 100 %."""
    columns = 80
    terminal = Terminal(columns)
    with on(terminal, monkeypatch) as shown:
        for line in rank_0_output(until_step=45):
            relay(shown, line)
        log.say("workers restarted (1 so far, run.max_failures), resuming")
        for line in rank_0_output():
            relay(shown, line)
        shown.close()
    screen = terminal.screen()
    bars = bar_rows(screen)
    assert len(bars) == 1 and bars[0].startswith("epoch 3/3 100%|"), screen
    assert screen.index("[trainforge] workers restarted (1 so far, run.max_failures), resuming") < (
        screen.index(bars[0])
    )
