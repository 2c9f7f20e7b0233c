"""The warm tracker: a process of the lasting cluster's pool (``warm_pool.tracker``) that makes,
relays and ends one warm command's MLflow run after another's (``mlflow_run.CommandRun``), with
MLflow, its stores, its pytorch flavour and matplotlib imported once, as warm workers keep torch
and the loop.

Why: a command is always a new process, and its MLflow calls import what they use — on one H100
without bytecode, the run's making took 4.0 s of a warm command and its end (the model's
logging, the learning curve) 7.2 s more, for 0.5 s of training: the warm command's wall time was
9.1 s where its workers were done after 1.8 s. In the warm tracker the same calls come to 2.6 s
of wall time. It is the command's side of tracking, not a worker's: rank 0 writes its records
to the run folder as on every path (``tracking/relay.py``) and the tracker sends them. Its lines
(the run's phase line, a warning) go to a file in the run folder that the command shows.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from trainforge import config, log, plots
from trainforge.config import Recipe
from trainforge.driver import console, mlflow_run
from trainforge.driver.mlflow_run import CommandRun
from trainforge.tracking.client import RunHandle
from trainforge.worker import environment
from trainforge.worker.warm import WarmWorker, lines_to, release_run_memory

IMPORTS = ("mlflow.pytorch", "trainforge.tracking.relay", *plots.MATPLOTLIB)
"""What the run's making and end import (its learning curve: matplotlib's figure and SVG
writer, not pyplot): once, at the tracker's start."""


class WarmTracker(WarmWorker):
    """The actor class (``warm_pool.tracker`` makes it a detached Ray actor). A tracker serves
    one command at a time; it is kept fit as a warm worker is (``serve``), and ends, as one
    does, with the command it serves or after ``TRAINFORGE_WARM_IDLE_S`` unused."""

    LOOP = "trainforge.driver.mlflow_run"

    def __init__(self, sys_path: list[str], driver_pid: int, idle_s: float) -> None:
        super().__init__(sys_path, driver_pid, idle_s, None, imports=IMPORTS)
        self._held = contextlib.ExitStack()
        self._run: CommandRun | None = None

    def begin(self, recipe: dict[str, Any], tags: dict[str, str], env: dict[str, str],
              lines: str, leftover_end: int, started: float) -> None:  # fmt: skip
        """Begin making the command's run, tagged ``tags``, with the command's environment
        ``env`` taken on until its end, this process's lines to the file ``lines``;
        ``leftover_end``, the relay file's size the command found before its workers started
        (this call may come after rank 0 has written); ``started``, the command's start."""
        from trainforge import config

        self.running = True
        try:
            self._held.enter_context(lines_to(Path(lines), 0))
            self._held.enter_context(environment.applied(env))
            self._run = CommandRun.begin(
                config.from_container(recipe), None, tags, leftover_end, started
            )
        except BaseException:
            self._held.close()
            self.running = False
            raise

    def end(self, status: str, checkpoint_path: str | None, reason: str | None,
            quiet: bool) -> dict[str, Any] | None:  # fmt: skip
        """``CommandRun.end``: the run's handle, or None where it could not be made."""
        try:
            if self._run is None:  # begin failed: said in its own answer
                return None
            handle = self._run.end(status, checkpoint_path, reason, quiet)
            return handle.for_workers() if handle is not None else None
        finally:
            self._run = None
            self._held.close()
            self.running = False
            release_run_memory()
            self.note_imports()


class TrackerRun:
    """The command's side of a run the warm tracker makes (``mlflow_run.MadeRun``): the
    tracker's lines shown as the command's, its slot held (``held``) until the run's end."""

    def __init__(self, tracker: Any, cfg: Recipe, lines: Path, held: contextlib.ExitStack) -> None:
        from trainforge.driver import local_cluster
        from trainforge.tracking import driver as tracking
        from trainforge.tracking import relay

        self.tracker = tracker
        self.for_workers = mlflow_run.handle_for_workers(cfg)
        self._held = held
        shown = console.Console(None)
        held.callback(shown.close)
        held.callback(console.relay_file(lines, shown))
        # not awaited: the workers start meanwhile, as beside a CommandRun's making
        left = relay.size(Path(str(self.for_workers.relay_path)))  # before the workers write
        self._begun = tracker.begin.remote(config.to_container(cfg), tracking.driver_tags(),
                                           local_cluster.worker_env(), str(lines),
                                           left, log.STARTED_AT)  # fmt: skip

    def end(
        self,
        status: str,
        checkpoint_path: str | None = None,
        reason: str | None = None,
        quiet: bool = False,
    ) -> RunHandle | None:
        import ray

        try:
            ray.get(self._begun)
            handle = ray.get(self.tracker.end.remote(status, checkpoint_path, reason, quiet))
        except ray.exceptions.RayError as exc:  # the tracker gone: rank 0's records wait
            log.warn(f"the MLflow run could not be made or ended by the warm tracker "
                     f"({log.first_line(exc)}); what rank 0 wrote is kept in "
                     f"{self.for_workers.relay_path} for the run's next command")  # fmt: skip
            handle = None
        finally:
            self._held.close()  # the tracker's last lines shown, its slot released
        return RunHandle(**handle) if handle is not None else None
