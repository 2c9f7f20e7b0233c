"""What a sweep shows: a line when a trial starts, ends, is stopped early or fails, a line
when the best so far changes, and the closing table of every trial, best first. The trials'
own lines are in their log files (``<run folder>/trials/<trial>.log``)."""

from __future__ import annotations

import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ray import tune

from trainforge import log
from trainforge.config.schema import SweepSection
from trainforge.config.sweep_space import Dimension, override_value
from trainforge.driver import sweep_board
from trainforge.driver.sweep_trial import FINISHED_RECORD

# Tune's folder of a trial: its name, and a suffix where a restored trial's folder existed
_TRIAL_FOLDER = re.compile(r"^(.*-t\d+)_\w+$")
FINISHED, STOPPED, FAILED, UNFINISHED = "finished", "stopped early", "failed", "unfinished"


@dataclass
class Trial:
    """A trial as the sweep ended with it."""

    name: str
    settings: dict[str, Any]
    state: str
    value: float | None
    """The sweep's metric: the run's final value where it ended, else its last reported."""
    epoch: int
    seconds: float
    reason: str = ""
    run_id: str | None = None
    """Its MLflow run, where it finished (its run folder's record)."""
    metrics: dict[str, float] = field(default_factory=dict)


class SweepConsole:
    def __init__(self, sweep: str, metric: str, mode: str, trials_dir: Path) -> None:
        self.sweep, self.metric, self.mode, self.trials_dir = sweep, metric, mode, trials_dir

    def tune_callback(self, total: int) -> tune.Callback:
        """Tune keeps it in the sweep's state (a restore brings back this one): it holds
        only what it prints from."""
        return TrialLines(self.sweep, self.metric, self.mode, str(self.trials_dir), total)

    def resuming(self) -> None:
        log.say(f"sweep '{self.sweep}': resuming (finished trials are kept; unfinished ones "
                "resume from their checkpoints)")  # fmt: skip

    def begin(
        self, section: SweepSection, dimensions: list[Dimension], trials: int, at_once: int
    ) -> None:
        space = ", ".join(f"{d.key} {d.written()}" for d in dimensions)
        stopper = "asha" if section.scheduler == "asha" else "no early stopping"
        log.say(
            f"sweep '{self.sweep}': {trials} trials of {space}; {section.search} "
            f"search, {stopper} on {self.metric} ({self.mode}); {at_once} at a time"
        )

    def trials_from(self, results: Any) -> list[Trial]:
        trials = [self._trial(result) for result in results]
        return sorted(trials, key=lambda t: int(t.name.rsplit("-t", 1)[1]))

    def _trial(self, result: Any) -> Trial:
        metrics = dict(result.metrics or {})
        name = _TRIAL_FOLDER.sub(r"\1", Path(result.path).name)
        finished = _finished_record(self.trials_dir / name)
        if result.error is not None:
            state, reason = FAILED, failure_reason(result.error)
        elif metrics.get("trial/finished"):
            state, reason = FINISHED, ""
        elif metrics.get("epoch"):  # its run ended at the end of the epoch it was in
            state, reason = STOPPED, "asha"
            metrics |= finished.get("metrics", {})
        else:
            state, reason = UNFINISHED, ""
        value = metrics.get(self.metric)
        numbers = {k: v for k, v in metrics.items() if "/" in k and isinstance(v, int | float)}
        return Trial(
            name, dict(result.config), state,
            float(value) if isinstance(value, int | float) else None,
            int(metrics.get("epoch", 0)), float(metrics.get("time_total_s", 0.0)),
            reason, finished.get("mlflow_run_id"), numbers,
        )  # fmt: skip

    def ranked(self, trials: list[Trial]) -> list[Trial]:
        """Trials with a value, best first, then the rest."""
        scored = [t for t in trials if t.value is not None and math.isfinite(t.value)]
        sign = _sign(self.mode)
        scored.sort(key=lambda t: sign * float(t.value or 0.0))
        return scored + [t for t in trials if t not in scored]

    def summary(self, trials: list[Trial], seconds: float, handle: Any) -> None:
        states = (FINISHED, STOPPED, FAILED, UNFINISHED)
        counts = ", ".join(f"{n} {s}" for s in states if (n := sum(t.state == s for t in trials)))
        log.result(f"sweep '{self.sweep}' ended in {seconds:.1f} s: {len(trials)} trials, {counts}")
        keys = sorted({k for t in trials for k in t.settings})
        heading = [f"{'trial':<8}", f"{self.metric:>10}", "epochs", f"{'state':<13}", *keys]
        log.result("  " + "  ".join(heading))
        for trial in self.ranked(trials):
            value = f"{trial.value:>10.4f}" if trial.value is not None else f"{'-':>10}"
            label = trial.name.rsplit("-", 1)[1]
            row = [f"{label:<8}", value, f"{trial.epoch:>6}", f"{trial.state:<13}"]
            log.result(
                "  " + "  ".join(row + [shown_value(trial.settings.get(k, "")) for k in keys])
            )
        best = next((t for t in self.ranked(trials) if t.state == FINISHED), None)
        if best is not None:
            log.result(f"  best: {best.name}, its run folder {self.trials_dir / best.name}")
        if handle is not None and handle.run_id is not None:
            log.result(f"  mlflow run   {handle.run_id} (the trials' runs nested under it)")


class TrialLines(tune.Callback):
    """Tune's callback: one line per trial event, the best so far as it changes, and in a
    terminal the live board of the best trials (``sweep_board.py``)."""

    def __init__(self, sweep: str, metric: str, mode: str, trials_dir: str, total: int) -> None:
        self.sweep, self.metric, self.mode, self.trials_dir = sweep, metric, mode, trials_dir
        self.total = total
        self.best: tuple[float, str] | None = None
        self.latest: dict[str, tuple[float, int, str]] = {}  # trial: its metric, epoch, settings
        self.running: set[str] = set()
        self.ended = 0
        self.board: sweep_board.Board | None = None

    def __getstate__(self) -> dict[str, Any]:
        """What Tune keeps in the sweep's state: not the board on this terminal."""
        return {**self.__dict__, "board": None}

    def on_trial_start(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        log.say(f"sweep: {_label(trial)} started: {_settings(trial)}")
        self.running.add(_label(trial))
        self._redraw()

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        value = result.get(self.metric)
        if not isinstance(value, int | float) or not math.isfinite(value):
            return
        self.latest[_label(trial)] = (float(value), int(result.get("epoch", 0)), _settings(trial))
        self._redraw()
        better = self.best is None or _sign(self.mode) * (value - self.best[0]) < 0
        if better:
            self.best = (float(value), trial.trial_id)
            log.say(f"sweep: best so far {_label(trial)} {self.metric} {value:.4f} at epoch "
                    f"{result.get('epoch', '?')}")  # fmt: skip

    def on_trial_complete(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        result = trial.last_result or {}
        value = result.get(self.metric)
        shown = f"{self.metric} {value:.4f}" if isinstance(value, int | float) else "no metric"
        if result.get("trial/finished"):
            log.say(f"sweep: {_label(trial)} finished: {shown} after {result.get('epoch')} epochs")
        else:
            log.say(f"sweep: {_label(trial)} stopped early by asha after epoch "
                    f"{result.get('epoch')} ({shown}); its run ends with the epoch it is "
                    "in")  # fmt: skip
        self._ended(trial)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        try:
            reason = failure_reason(trial.get_pickled_error())
        except Exception:  # an error Tune could not keep: its log says
            reason = "see its output"
        where = Path(self.trials_dir) / f"{trial}.log"
        log.warn(f"sweep: {_label(trial)} failed: {reason}; its output: {where}")
        self._ended(trial)

    def _ended(self, trial: Any) -> None:
        self.running.discard(_label(trial))
        self.ended += 1
        self._redraw()

    def _redraw(self) -> None:
        """The board, drawn first where stdout is a terminal and lines are shown."""
        if self.board is None:
            if not sys.stdout.isatty() or log.verbosity() < 0:
                return
            self.board = sweep_board.Board(sys.stdout, self.total, f"sweep '{self.sweep}'")
        sign = _sign(self.mode)
        ranked = sorted(self.latest.items(), key=lambda item: sign * item[1][0])
        rows = [f"{label:>4} {self.metric} {value:.4f} at epoch {epoch}: {settings}"
                for label, (value, epoch, settings) in ranked[: sweep_board.ROWS]]  # fmt: skip
        self.board.show(self.ended, len(self.running), rows)


def failure_reason(error: BaseException | None) -> str:
    """Why a trial failed, in one line: the trial's own error (``sweep_trial.TrialFailed``),
    not the Ray task error wrapping it."""
    if error is None:
        return "unknown"
    cause = getattr(error, "cause", None)
    return log.first_line(cause if isinstance(cause, BaseException) else error)


def shown_value(value: Any) -> str:
    """A trial's setting as the console shows it: a float to four significant digits (the
    trial ran with the whole value, which trials.csv keeps)."""
    return f"{value:.4g}" if isinstance(value, float) else override_value(value)


def _sign(mode: str) -> float:
    """What orders values best first when multiplied in: 1 for min, -1 for max."""
    return 1.0 if mode == "min" else -1.0


def _settings(trial: Any) -> str:
    return " ".join(f"{k}={shown_value(v)}" for k, v in trial.config.items())


def _label(trial: Any) -> str:
    """``t3`` of ``<sweep>-t3``."""
    return str(trial).rsplit("-", 1)[-1]


def _finished_record(run_dir: Path) -> dict[str, Any]:
    try:
        record: dict[str, Any] = json.loads((run_dir / FINISHED_RECORD).read_text())
        return record
    except (OSError, ValueError):
        return {}
