"""What the command gives every worker for one run, the same on every worker path (the command's
own processes, warm workers, Ray Train's): frozen and picklable, with no torch, so the driver
builds it without importing the loop."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class WorkerPayload:
    recipe: dict[str, Any]
    """The resolved recipe as a plain container (``config.from_container`` rebuilds it)."""
    run_dir: str
    """The run's folder (or URI, for remote storage): checkpoints, the relay and console files."""
    command: str
    """An id of this command, shared by its restarts: rank 0 counts them by it
    (``worker/restarts.py``)."""
    env: dict[str, str] = field(default_factory=dict)
    """The command's environment, which workers of an earlier command's cluster take on for
    this run (``worker/environment.py``)."""
    requested_at: float = field(default_factory=time.time)
    """When the workers were asked for (``time.time()``): rank 0 says how long they took."""
    mlflow: dict[str, Any] | None = None
    """The MLflow run's handle for the workers (``tracking.client.RunHandle``'s fields); None:
    no tracking."""
    handover_key: str | None = None
    """Where workers placed on another node than the command's take the MLflow run from once it
    is made (Ray's key-value store, ``driver/mlflow_handover.py``); None: every rank 0 relays."""
    relay_node: str | None = None
    """The command's Ray node: a rank 0 there writes its records for the command to send."""
    console_file: str | None = None
    """Where the workers write their lines for the command to show (processes that are not the
    command's children, or whose output Ray does not relay); None: their own output."""
    gpus: tuple[str, ...] = ()
    """The GPU of each rank, where the command binds them (for rank 0's line)."""
    started: int = 0
    """How many of the ranks are processes started for this command (the rest were warm)."""
    plugins: tuple[str, ...] = ()
    """Modules each worker imports before its loop, whose ``install(trainer, checkpointer)``
    may wrap the loop's parts (``TRAINFORGE_WORKER_PLUGINS``: the tests' fault injection)."""

    def but(self, **changes: Any) -> WorkerPayload:
        """A copy with ``changes``."""
        return dataclasses.replace(self, **changes)

    @property
    def keep_last(self) -> int:
        return int(self.recipe["checkpoint"]["keep_last"])

    @property
    def timeout_s(self) -> float:
        return float(self.recipe["scaling"]["timeout_s"])
