"""Warm workers as a command's worker group: the lasting local cluster's pool of detached actors
(``driver/warm_pool.py``), each of which runs the loop for one command after another
(``worker/warm.py``). A command claims free slots, takes the worker of each (started ahead by
this command, found fit to serve it, or started now), and runs the loop in them over a new
process group. A Ray actor's output reaches only the command that created it: the workers write
their lines to the run folder's console file, which this command shows."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from trainforge import log, storage
from trainforge.config import Recipe
from trainforge.driver import console, local_cluster, warm_pool
from trainforge.driver.mlflow_run import MadeRun
from trainforge.driver.workers.base import Failures, Finished, WorkerGroup, from_ray
from trainforge.worker.payload import WorkerPayload

OTHERS_WAIT_S = 1.0
"""After a rank fails, how long the others' answers are awaited (``own.OTHERS_WAIT_S``)."""
STOP_WAIT_S = 10.0
"""How long stopped workers' unanswered calls are waited for, to be read."""


class WarmWorkers(WorkerGroup):
    """One command's warm workers, from claiming their slots to releasing them. ``ahead``: this
    command's workers started before (by name); ``slots``: these slots' workers, unclaimed (a
    rehearsal: a command that claims one meanwhile waits for the worker's run to end, then
    takes it); None: free slots, claimed."""

    kind = "warm"

    def __init__(
        self, cfg: Recipe, ahead: dict[str, Any] | None = None, slots: list[int] | None = None
    ) -> None:
        super().__init__(cfg)
        self.ahead = ahead
        self.given_slots = slots
        self.slots: list[int] = []
        self.gpus: list[str] | None = None
        self.members: list[Any] = []
        self.started = 0
        self._unanswered: list[Any] = []  # the last attempt's calls still running at its end
        self._held = contextlib.ExitStack()
        self.tracker_lines = Path()  # where the warm tracker's lines go (``prepare``)

    def start(self) -> None:
        """The first time: start the workers the run needs where none lives, so that their
        imports overlap the data stage; after a failure: new ones in the slots held."""
        if self.ahead is None:
            self.ahead = warm_pool.prestart(self.cfg)
            if self.ahead:
                from trainforge.driver import bytecode

                bytecode.warn_if_workers_compile_torch()
        elif self.slots:
            self.members, self.started = warm_pool.members(self.slots, self.gpus, {})

    def prepare(self, payload: WorkerPayload) -> WorkerPayload:
        for left in Path(payload.run_dir).glob(".*-lines-*"):  # a killed command's
            left.unlink(missing_ok=True)  # (one command per run at a time: run_lock.py)
        self.tracker_lines = Path(payload.run_dir) / f".tracker-lines-{payload.command}"
        output = console.attach(storage.local_folder(payload.run_dir))
        if output is not None:
            self._held.callback(output.close)
        lines = warm_pool.console_file(payload)
        self._held.callback(console.relay_file(lines, output))
        cfg = self.cfg
        self.slots = self.given_slots or self._held.enter_context(
            warm_pool.claimed_slots(cfg.scaling.num_workers, warm_pool.living_slots(),
                                    warm_pool.gpu_count(cfg))
        )  # fmt: skip
        self.gpus = warm_pool.slot_gpus(self.slots) if cfg.scaling.use_gpu == "true" else None
        self.members, self.started = warm_pool.members(self.slots, self.gpus, self.ahead or {})
        return payload.but(console_file=str(lines), gpus=tuple(self.gpus or ()))

    def begin_run(self, cfg: Recipe) -> MadeRun:
        """Made by the lasting cluster's warm tracker (``driver/warm_tracker.py``), where MLflow
        is imported already; by the command where the tracker cannot be had."""
        import ray

        from trainforge.driver.warm_tracker import TrackerRun

        held = contextlib.ExitStack()
        try:
            tracker = held.enter_context(
                warm_pool.tracker(self.ahead or {}, claim=self.given_slots is None)
            )
            return TrackerRun(tracker, cfg, self.tracker_lines, held)
        except (ray.exceptions.RayError, ValueError) as exc:
            held.close()
            log.warn(f"the warm tracker could not be had ({log.first_line(exc)}); this "
                     "command makes the MLflow run")  # fmt: skip
            return super().begin_run(cfg)

    def run(self, payload: WorkerPayload) -> Finished | Failures:
        import ray

        payload = payload.but(started=self.started)
        port, world_size = local_cluster.free_port(), len(self.members)
        ranks = {
            member.run.remote(payload, rank, world_size, port, os.getpid()): rank
            for rank, member in enumerate(self.members)
        }
        results: dict[int, dict[str, Any]] = {}
        failures: Failures = {}
        pending = list(ranks)
        try:
            while pending:
                timeout = OTHERS_WAIT_S if failures else None
                done, pending = ray.wait(pending, num_returns=1, timeout=timeout)
                if not done:  # the others wait in a collective for a failed rank
                    break
                try:
                    results[ranks[done[0]]] = ray.get(done[0])
                except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as exc:
                    failures[ranks[done[0]]] = from_ray(exc, ranks[done[0]])
        except BaseException:  # Ctrl-C, SIGTERM: the workers stop with the command
            self._unanswered = pending
            self.stop()
            raise
        if failures:
            self._unanswered = pending  # the others, waiting in a collective for the failed
            return failures
        return Finished(results[0]["metrics"], results[0]["checkpoint"])

    def stop(self) -> None:
        """Blocked in a collective, or gone: not reusable. The calls they did not answer are
        collected (they fail as their workers go): Ray would print each error left unread with
        its traceback, after the command's one line."""
        import ray

        for member in self.members:
            with contextlib.suppress(Exception):
                ray.kill(member, no_restart=True)
        self.members = []
        if self._unanswered:
            ended, _ = ray.wait(self._unanswered, num_returns=len(self._unanswered),
                                timeout=STOP_WAIT_S)  # fmt: skip
            for ref in ended:
                with contextlib.suppress(Exception):
                    ray.get(ref)
            self._unanswered = []

    def close(self) -> None:
        self._held.close()  # the workers' last lines shown, the slots released
