"""The MLflow run of Ray Train's workers, handed to those that talk to MLflow themselves.

Ray Train's worker group takes 10-15 s to start on a 2-core machine (its controller, placement
group, worker processes and process group). The MLflow run (MLflow's import, its store, the
run's params and tags: ~2.5 s there) is made on a thread while the group starts
(``tracking.relay.RunInTheMaking``). Rank 0 on the command's node needs no run: it writes its
records for the command to send (``tracking/relay.py``). A rank 0 that Ray placed on another
node, and each other node's first worker (its system metrics), need the run: it is handed to
them through Ray's key-value store (``ray_compat.kv_put``), which every worker reaches on any
node; they take it where their tracking begins (``tracking.worker.handed_over``), by when it is
long made; a worker that gets there first waits for it.
"""

from __future__ import annotations

import json

from trainforge import ray_compat
from trainforge.tracking.client import RunHandle


class Handover:
    """Hands the run over under ``key`` (``__call__``, from the thread that made it) and takes
    it back out of Ray's store at the end (``close``)."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.handed = False

    def __call__(self, handle: RunHandle) -> None:
        ray_compat.kv_put(self.key, json.dumps(handle.for_workers()).encode())
        self.handed = True

    def close(self) -> None:
        """No later worker needs it."""
        if self.handed:
            ray_compat.kv_del(self.key)
