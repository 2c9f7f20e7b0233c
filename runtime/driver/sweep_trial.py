"""One trial of a sweep, run by Ray Tune in its trial actor: the `trainforge train` a user
would type for the trial's settings, in a process of its own, so a trial is a whole run (its
worker group, checkpoints, exact resume, MLflow run) and nothing of the loop is written twice.

Each epoch's metrics reach Tune from the command's progress events (``progress_events.py``,
printed as JSON lines for the sweep: ``settings.PROGRESS_EVENTS``); the run's final metrics
(an SBI run's C2ST too) from the record it leaves (``finished_run.FILE``). When Tune stops the
trial (ASHA), its run is asked to end at its epoch's end (``stop_request.py``): it ends
FINISHED and its workers stay for the next trial, which Tune starts in the same actor. The
command's own lines go to the trial's log file, not to the sweep's console.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import queue
import signal
import subprocess
import threading
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ray import tune

from trainforge import log, progress_events, stop_request
from trainforge.config.sweep_space import override_value

REFUSAL = "trainforge: error: "  # log.refuse's lines
STOP_WAIT_S = 600.0  # a stopped trial's run ends its epoch (validation, checkpoint, evaluation)
END_WAIT_S = 60.0  # a SIGTERMed command ends its MLflow run and writes its last lines
FINISHED_RECORD = "finished.json"  # driver/finished_run.py's FILE (not imported: the actor
# imports no driver module beyond this one)


@dataclass(frozen=True)
class TrialJob:
    """What every trial of one sweep shares."""

    command: list[str]
    """`trainforge train <the sweep's recipe>` with the trials' storage, less the trial's
    settings and run.name."""
    env: dict[str, str]
    trials_dir: str
    """Where the trials' run folders and console logs are."""
    metric: str
    """The sweep's metric: Tune takes only results that hold it."""
    cwd: str
    """The sweep command's working directory: the trial's command runs there, as the user's
    would (a relative recipe path, ./runs, sqlite:///mlflow.db mean the same)."""


class TrialFailed(RuntimeError):
    """The trial's command exited non-zero; the message is its last error line."""


def trial_name(sweep: str, index: int | str) -> str:
    return f"{sweep}-t{index}"


class TrialRun(tune.Trainable):
    """Tune's trainable of a trial: ``step`` returns each epoch the command reports, then its
    final metrics; ``reset_config`` (Tune reuses the actor for the next trial) and ``cleanup``
    end a command still running as a stopped trial's (``_end_command``)."""

    def setup(self, config: dict[str, Any], job: TrialJob | None = None) -> None:
        assert job is not None  # tune.with_parameters gives it
        self.job = job
        self._start(config)

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self._end_command()
        self._start(new_config)
        return True

    def cleanup(self) -> None:
        self._end_command()

    def _start(self, config: dict[str, Any]) -> None:
        self.name = self.trial_name
        self.run_dir = Path(self.job.trials_dir) / self.name
        overrides = [f"{key}={override_value(value)}" for key, value in config.items()]
        self.process = subprocess.Popen(
            [*self.job.command, *overrides, f"run.name={self.name}"], env=self.job.env,
            cwd=self.job.cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            bufsize=1, preexec_fn=_end_with_this_process,
        )  # fmt: skip
        self.said: deque[str] = deque(maxlen=40)
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        log_file = Path(self.job.trials_dir) / f"{self.name}.log"
        self.follower = threading.Thread(
            target=_follow, args=(self.process, log_file, self.said, self.events), daemon=True
        )
        self.follower.start()
        self.epoch = 0

    def step(self) -> dict[str, Any]:
        """The next epoch with the sweep's metric (the last one only once the run finished:
        never a reason to stop it; a score measured at a run's end only then), or the end."""
        while (event := self.events.get()) is not None:
            self.epoch = int(event["epoch"])
            if self.epoch != event.get("epochs") and self.job.metric in event["metrics"]:
                return {**event["metrics"], "epoch": self.epoch}
        code = self.process.wait()
        if code != 0:
            raise TrialFailed(f"{self.name}: `trainforge train` exited {code}: "
                              f"{_reason(self.said)}")  # fmt: skip
        final = _final_metrics(self.run_dir)
        if self.job.metric not in final:
            raise TrialFailed(f"{self.name}: the run finished without the sweep's metric "
                              f"{self.job.metric} (it recorded "
                              f"{', '.join(sorted(final)) or 'none'})")  # fmt: skip
        epoch = max(self.epoch, int(final.get("epoch", 0)))
        return {**final, "epoch": epoch, "trial/finished": 1, "done": True}

    def _end_command(self) -> None:
        """A command still running (Tune stopped the trial) is asked to end its run at its
        epoch's end, and given STOP_WAIT_S to; then it ends as a SIGTERM ends a run."""
        if self.process.poll() is None and self.run_dir.is_dir():
            stop_request.write(self.run_dir, f"the sweep's scheduler stopped {self.name}")
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=STOP_WAIT_S)
        _end(self.process)
        self.follower.join(timeout=END_WAIT_S)  # the command's last lines into its log


def _follow(
    process: subprocess.Popen[str],
    log_file: Path,
    said: deque[str],
    events: queue.Queue[dict[str, Any] | None],
) -> None:
    """The command's output to its end: its lines into the trial's log (an epoch event as the
    console prints it) and the last ones into ``said``; its epoch events onto ``events``,
    then None."""
    assert process.stdout is not None
    with open(log_file, "a", encoding="utf-8") as kept:
        for line in process.stdout:
            event = progress_events.read(line.rstrip("\n"))
            if event is None:
                kept.write(line)
                said.append(line.rstrip("\n"))
            elif event["kind"] == "epoch":
                kept.write(f"{log.PREFIX} {progress_events.text(event)}\n")
                events.put(event)
            kept.flush()
    events.put(None)


def _final_metrics(run_dir: Path) -> dict[str, float]:
    try:
        record = json.loads((run_dir / FINISHED_RECORD).read_text())
        metrics = record["metrics"]
    except (OSError, ValueError, KeyError):
        return {}
    return {k: float(v) for k, v in metrics.items() if isinstance(v, int | float)}


def _reason(said: deque[str]) -> str:
    """The command's refusal ("trainforge: error: …"), else its last line: why it failed."""
    refusals = [line for line in said if line.startswith(REFUSAL)]
    if refusals:
        return refusals[-1][len(REFUSAL) :]
    lines = [line for line in said if line.strip()]
    return lines[-1] if lines else "no output"


def _end(process: subprocess.Popen[str]) -> None:
    """A command still running (Tune stopped the trial) ends as a SIGTERM ends it."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=END_WAIT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _end_with_this_process() -> None:
    """In the trial's command, before it runs: a SIGTERM when the trial's actor dies (Tune
    or Ray ends it without a word), so no command outlives its trial."""
    pr_set_pdeathsig = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
