"""One trial of a sweep, run by Ray Tune in its trial actor: the `trainforge train` a user
would type for the trial's settings, in a process of its own, so a trial is a whole run (its
worker group, checkpoints, exact resume, MLflow run) and nothing of the loop is written twice.

Each epoch's metrics reach Tune from the command's progress events (``progress_events.py``,
printed as JSON lines for the sweep: ``settings.PROGRESS_EVENTS``); the run's final metrics
(an SBI run's C2ST too) from the record it leaves (``finished_run.FILE``). When Tune stops the
trial (ASHA), its command is ended as a SIGTERM ends one: the MLflow run KILLED, resumable.
The command's own lines go to the trial's log file, not to the sweep's console.
"""

from __future__ import annotations

import ctypes
import json
import signal
import subprocess
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainforge import log, progress_events
from trainforge.config.sweep_space import override_value

REFUSAL = "trainforge: error: "  # log.refuse's lines
END_WAIT_S = 60.0  # a stopped trial's command ends its MLflow run and writes its last lines
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


def run_trial(config: dict[str, Any], job: TrialJob) -> None:
    """Tune's function trainable: the trial's command to its end, its epochs reported."""
    from ray import tune

    name = tune.get_context().get_trial_name()
    overrides = [f"{key}={override_value(value)}" for key, value in config.items()]
    folder = Path(job.trials_dir)
    process = subprocess.Popen(
        [*job.command, *overrides, f"run.name={name}"], env=job.env, cwd=job.cwd,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
        preexec_fn=_end_with_this_process,
    )  # fmt: skip
    said: deque[str] = deque(maxlen=40)
    epoch = 0
    try:
        with open(folder / f"{name}.log", "a", encoding="utf-8") as kept:
            assert process.stdout is not None
            for line in process.stdout:
                event = progress_events.read(line.rstrip("\n"))
                if event is None:
                    kept.write(line)
                    kept.flush()
                    said.append(line.rstrip("\n"))
                elif event["kind"] == "epoch":
                    kept.write(f"{log.PREFIX} {progress_events.text(event)}\n")
                    kept.flush()
                    epoch = int(event["epoch"])
                    # the last epoch is reported once the run finished (never a reason to
                    # stop it); a score measured at a run's end only then
                    if epoch != event.get("epochs") and job.metric in event["metrics"]:
                        tune.report({**event["metrics"], "epoch": epoch})
        code = process.wait()
    finally:
        _end(process)
    if code != 0:
        raise TrialFailed(f"{name}: `trainforge train` exited {code}: {_reason(said)}")
    final = _final_metrics(folder / name)
    if job.metric not in final:
        raise TrialFailed(f"{name}: the run finished without the sweep's metric {job.metric} "
                          f"(it recorded {', '.join(sorted(final)) or 'none'})")  # fmt: skip
    tune.report({**final, "epoch": max(epoch, int(final.get("epoch", 0))), "trial/finished": 1})


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
