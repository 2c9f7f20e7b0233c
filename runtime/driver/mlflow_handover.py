"""The MLflow run of Ray Train's workers, made while they start.

Ray Train's worker group takes 10-15 s to start on a 2-core machine (its controller, placement
group, worker processes and process group). The MLflow run (MLflow's import, its store, the
run's params and tags: ~2.5 s there) was made before that start began, on the command's path to
its first step. It is now made on a thread while the group starts, and handed to the workers
through Ray's key-value store (``ray_compat.kv_put``), which every worker reaches on any node:
they take it where their tracking begins (``tracking.worker.handed_over``), by when it is long
made; a worker that gets there first waits for it.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from trainforge import ray_compat
from trainforge.log import first_line, warn


class MlflowHandover(threading.Thread):
    """Makes the run with ``make`` (given this object's ``quiet`` event: set, the run's phase
    line is not said) and hands its handle over under ``key``; ``fallback`` (no run id: the
    workers spool their records) where the making itself failed."""

    WAIT_S = 60.0  # at the end: how long the run's making may still take (MLflow's timeouts)

    def __init__(self, make: Callable[[threading.Event], Any], fallback: Any, key: str) -> None:
        super().__init__(name="trainforge-mlflow-handover", daemon=True)
        self.make, self.fallback, self.key = make, fallback, key
        self.quiet = threading.Event()
        self.handle: Any = None

    def run(self) -> None:
        try:
            handle = self.make(self.quiet)
        except Exception as exc:  # the run's start spools by itself; anything else is said
            warn(f"the MLflow run could not be started ({first_line(exc)}); its records are "
                 f"kept in {self.fallback.spool_path}")  # fmt: skip
            handle = self.fallback
        self.handle = handle
        ray_compat.kv_put(self.key, json.dumps(handle.for_workers()).encode())

    def made(self) -> Any:
        """After the workers' run: the run's handle (None: still not made after WAIT_S)."""
        self.join(self.WAIT_S)
        return self.handle

    def close(self) -> None:
        """The handed-over handle taken out of Ray's store: no later worker needs it."""
        if self.handle is not None:
            ray_compat.kv_del(self.key)
