"""What the workers' output turns into on the user's console (driver side).

Ray relays every line a worker process prints to the driver, prefixed with the actor and pid:
Ray Train's per-report dumps, MLflow's INFO lines, C++ log lines from Ray's core. By default
(``normal``) only trainforge's own lines and real warnings from user code reach the console;
``quiet`` (``-q``) keeps only warnings and errors; ``verbose`` (``-v``) leaves Ray's printer
in place. Every line, shown or not, is kept in ``<run folder>/worker-output.log``.

Rank 0's progress comes as events (``progress_events.py``): in a terminal they draw one
progress bar (``progress_bar.py``); in a log or CI each becomes the plain line it stands for (no
colour codes either way), as it does in worker-output.log and under -v.
"""

from __future__ import annotations

import re
import sys
import threading
import time
from pathlib import Path
from typing import IO, Any

from trainforge import log, progress_events, ray_compat, settings
from trainforge.driver.progress_bar import Bar

# Python's `warnings` format: "path/file.py:12: UserWarning: text"
_PY_WARNING = re.compile(r"^\S+:\d+: \w*Warning: ")


class Console:
    """Ray's log batches in, the user's console out (``handle`` is Ray's log handler)."""

    def __init__(self, log_file: Path | None, out: IO[str] | None = None) -> None:
        self.out = out or sys.stdout
        self.tty = self.out.isatty()
        self.log_file = log_file
        self._file: IO[str] | None = None
        self._bar = Bar(self.out) if self.tty else None
        self._events = settings.PROGRESS_EVENTS.is_set()
        self.closed = False  # after the run: late lines (a stopped run's) are dropped
        self._lock = threading.Lock()  # Ray's log thread and the driver both write

    def handle(self, data: dict[str, Any]) -> None:
        pid = data.get("pid")
        if pid == "autoscaler" or self.closed:  # the autoscaler's status table; a late line
            return
        source = f"({data.get('actor_name') or data.get('task_name') or 'pid'} {pid})"
        with self._lock:
            for line in data.get("lines", []):
                self._keep(f"{source} {progress_events.as_text(line)}")
                if pid == "raylet":  # rare and serious: a worker killed for memory, a crash
                    if not ray_compat.is_late_metrics_agent(line):  # harmless: kept only
                        self._print(f"(raylet) {line}")
                else:
                    self._show(line, bool(data.get("is_err")))

    def close(self) -> None:
        self.closed = True
        with self._lock:
            if self._bar is not None:
                self._bar.close()  # its last frame stays, on a line of its own
            if self._file is not None:
                self._file.close()
                self._file = None

    def _show(self, line: str, is_err: bool) -> None:
        event = progress_events.read(line)
        if event is not None:
            if log.verbosity() >= 0:  # no progress under -q, no bar either
                self._progress(event)
        elif line.startswith(log.PREFIX):
            text = line[len(log.PREFIX) + 1 :]
            if log.verbosity() >= 0 or text.startswith("warning:"):
                self._print(line)
        elif is_err and _PY_WARNING.match(line):
            self._print(line)

    def _progress(self, event: progress_events.Event) -> None:
        """In a terminal, steps move the bar and the run's end leaves it at its last step;
        elsewhere each event is its plain line."""
        if self._events:  # a program reads them (a sweep's trial): as they came
            self._print(progress_events.line(**event))
            return
        if self._bar is not None and event["kind"] == "step":
            self._bar.step(event)
            return
        if self._bar is not None and event["kind"] == "finish":
            self._bar.finish(event)
        self._print(f"{log.PREFIX} {progress_events.text(event)}")

    def _print(self, line: str) -> None:
        log.write(self.out, line + "\n")  # above the bar, where one is drawn (log.write_around)

    def _keep(self, line: str) -> None:
        if self.log_file is None:
            return
        if self._file is None:
            self.log_file.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.log_file, "a", buffering=1)  # noqa: SIM115 - closed in close()
        self._file.write(line + "\n")


def attach(run_dir: Path | None) -> Console | None:
    """Put the console between Ray's relayed worker output and the terminal for this run
    (not under -v: then Ray prints as it always does); every line is kept in the run folder's
    ``worker-output.log``. Returns it, to be closed at the end; it stays Ray's printer after
    that, dropping what a stopped run's workers still print."""
    if log.verbosity() > 0:
        # Ray's printer (in case an earlier run replaced it), progress events as plain lines
        ray_compat.restore_worker_log_printer(progress_events.as_text)
        return None
    output = Console(run_dir / "worker-output.log" if run_dir else None)
    ray_compat.replace_worker_log_printer(output.handle)
    return output


# what the closing summary shows of the final metrics, in this order, with every val/, test/
# and best/ metric after them and an SBI run's scores last; the rest is in MLflow. Not
# perf/samples_per_s: that is the last logging window's rate, and the run's own is said once,
# on the line above the table ("finished at step N in T s, R samples/s")
SUMMARY_KEYS = ("epoch", "train/loss", "val/loss", "val/accuracy")
SCORE_KEYS = ("c2st/mean", "sbc/ks_pvalue_min", "sbc/max_ecdf_deviation")


def summary(
    run_name: str,
    metrics: dict[str, Any],
    checkpoint: str | None,
    mlflow_run: tuple[str, str] | None,
    heading: str | None = None,
) -> None:
    """The run's outcome as a short table: shown even under -q. ``heading`` replaces the
    first line ("run … finished in … s")."""
    from trainforge.tracking.client import redact, run_url

    shown = [k for k in SUMMARY_KEYS if k in metrics]
    shown += sorted(
        k for k in metrics if k.startswith(("val/", "test/", "best/")) and k not in shown
    )
    shown += [k for k in SCORE_KEYS if k in metrics]
    # each observation's C2ST in the observations' order (obs2 before obs10), where there are
    # several: one is the mean's
    observations = sorted((k for k in metrics if k.startswith("c2st/obs")),
                          key=lambda k: int(k.removeprefix("c2st/obs")))  # fmt: skip
    shown += observations if len(observations) > 1 else []
    rows = [(key, _value(metrics[key])) for key in shown]
    if checkpoint:
        rows.append(("checkpoint", checkpoint))
    if mlflow_run is not None:
        run_id, uri = mlflow_run
        url = run_url(uri, run_id)  # a server's run page; a local store's UI is started first
        rows.append(("mlflow run", url or f"{run_id} at {redact(uri)}"))
        if not uri.startswith(("http://", "https://")):
            rows.append(("open the UI", f"trainforge ui --tracking-uri {redact(uri)}"))
    width = max((len(key) for key, _ in rows), default=0)
    log.result(heading or f"run {run_name!r} finished in {time.time() - log.STARTED_AT:.1f} s")
    for key, value in rows:
        log.result(f"  {key:<{width}}  {value}")


def _value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4f}"
    return str(value)


def relay_file(path: Path, output: Console | None) -> Any:
    """Show the lines warm workers write to ``path`` (``worker/warm.py``: pid, rank, stderr
    flag, text, tab-separated) as Ray's relayed lines are shown; under -v (no ``output``) every
    line, prefixed with its worker. Returns the function that stops relaying: it shows what is
    left, then removes the file."""
    done = threading.Event()

    def show(line: str) -> None:
        pid, rank, is_err, text = [*line.split("\t", 3), "", "", ""][:4]
        if output is not None:
            output.handle({"pid": pid, "actor_name": f"TrainforgeWorker rank={rank}",
                           "lines": [text], "is_err": is_err == "1"})  # fmt: skip
        else:
            text = progress_events.as_text(text)
            log.write(sys.stdout, f"(TrainforgeWorker pid={pid}, rank={rank}) {text}\n")

    def follow() -> None:
        position, pending = 0, ""
        while True:
            finished = done.is_set()  # read once more after the stop: the last lines
            try:
                with open(path, encoding="utf-8", errors="replace") as stream:
                    stream.seek(position)
                    chunk = stream.read()
                    position = stream.tell()
            except FileNotFoundError:
                chunk = ""
            *lines, pending = (pending + chunk).split("\n")
            for line in lines:
                show(line)
            if finished:
                return
            done.wait(0.1)

    thread = threading.Thread(target=follow, name="trainforge-warm-lines", daemon=True)
    thread.start()

    def stop() -> None:
        done.set()
        thread.join(timeout=5)
        path.unlink(missing_ok=True)

    return stop
