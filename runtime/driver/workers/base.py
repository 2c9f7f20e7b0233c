"""The one interface for starting the processes that run the training loop, and the one failure
policy over it.

A ``WorkerGroup`` is one command's workers, however they are started: the command's own
processes (``own.py``), warm workers of the lasting local cluster (``warm.py``) or Ray Train's
worker group (``ray_train.py``). The command starts it (its imports overlap the data stage),
runs the loop on it once per attempt, and closes it; ``run_with_restarts`` decides, the same way
for all three, what a failed attempt leads to: a restart from the latest checkpoint within
``run.max_failures``, or the end of the run with every failed rank's error.
"""

from __future__ import annotations

import re
import signal
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from trainforge import log
from trainforge.config import Recipe
from trainforge.errors import NonFiniteLoss
from trainforge.log import first_line
from trainforge.worker.payload import WorkerPayload

if TYPE_CHECKING:
    from trainforge.driver.mlflow_run import MadeRun

OUT_OF_MEMORY = "out of memory: the kernel's OOM killer"  # the likeliest cause of a SIGKILL
CRASHES = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}


@dataclass
class Finished:
    """What rank 0 reported last with a checkpoint: the run's final metrics and checkpoint."""

    metrics: dict[str, Any]
    checkpoint_path: str | None


Failures = dict[int, BaseException]
"""Rank → the exception that rank's worker failed with, the first to fail first."""


class WorkerDied(RuntimeError):
    """A worker's process ended mid-run without an answer (killed, crashed)."""


class WorkersFailed(Exception):
    """The run's workers failed and no restart is left (or none would help); ``worker_failures``
    maps each failed rank to its exception (empty where the group itself failed: ``message``
    says how)."""

    def __init__(self, worker_failures: Failures, message: str | None = None) -> None:
        if message is None:
            rank = first_failed(worker_failures)
            error = cause(worker_failures[rank])
            message = f"rank {rank}: {type(error).__name__}: {first_line(error, limit=500)}"
        super().__init__(message)
        self.worker_failures = worker_failures


class WorkerGroup(ABC):
    """One command's workers. ``start`` (again after a failure), ``prepare`` once, ``run`` once
    per attempt, ``stop`` after a failed attempt, ``close`` at the end (also as a context
    manager)."""

    kind: ClassVar[str]
    """How the group is named in lines and in ``TRAINFORGE_WORKERS``."""
    rank0_may_be_elsewhere: ClassVar[bool] = False
    """Whether rank 0 may run on another node than the command's: it then talks to MLflow
    itself, the run handed over to it (``hand_over``), instead of writing for the command to
    send (``tracking/relay.py``)."""

    def __init__(self, cfg: Recipe) -> None:
        self.cfg = cfg
        """The recipe with its workers resolved against what this group's place offers."""

    def start(self) -> None:
        """Start (or find) the processes, so that their imports overlap what the command does
        next (the data stage); after a failure, new ones for the restart."""
        return None

    def prepare(self, payload: WorkerPayload) -> WorkerPayload:
        """The payload as this group's workers need it; their lines are shown from now until
        ``close``. Called once, before the first ``run``."""
        return payload

    hand_over: Callable[[Any], None] | None = None
    """Where ``rank0_may_be_elsewhere``: gives the MLflow run, once made, to the workers that
    talk to MLflow themselves."""

    def begin_run(self, cfg: Recipe) -> MadeRun:
        """The command's MLflow run, begun beside the workers (``driver/mlflow_run.py``)."""
        from trainforge import plots
        from trainforge.driver.mlflow_run import CommandRun

        plots.preload()  # imported while the workers train: the run's end draws its curve
        return CommandRun.begin(cfg, self.hand_over)

    @abstractmethod
    def run(self, payload: WorkerPayload) -> Finished | Failures:
        """One attempt of the loop on every rank: what it finished with, or the failed ranks'
        errors. A stop (Ctrl-C, SIGTERM) raises KeyboardInterrupt; a failure of the group
        itself, which no restart helps, ``WorkersFailed``."""

    def stop(self) -> None:
        """End this attempt's processes: after a failure they may be blocked in a collective
        for the failed rank, or gone."""
        return None

    def close(self) -> None:
        """Stop the workers, show their last lines and give back what the group holds. Again:
        nothing happens."""
        return None

    def after(self, exit_code: int) -> None:
        """What the group leaves for later commands once the run has ended."""
        return None

    def __enter__(self) -> WorkerGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


PORT_TAKEN_RESTARTS = 3
"""How many times a group is started again, beyond ``run.max_failures``, because another
process took its rendezvous port (``port_taken``): a race a new start is all but sure to win;
where binding keeps failing, the run still ends, with that error."""


def run_imports(cfg: Recipe) -> tuple[str, ...]:
    """What a run of ``cfg`` imports beyond torch and the loop, for a group's new workers to
    import before the run needs it: ``torch._dynamo`` where the run needs it (DDP's
    constructor, ``torch.compile``; a lone rank that does not compile never imports it:
    ``optim.WithoutDynamo``), and what the workload's first step imports."""
    from trainforge.workloads import spec_for

    needs_dynamo = cfg.scaling.num_workers > 1 or cfg.precision.compile
    dynamo = ("torch._dynamo",) if needs_dynamo else ()
    return dynamo + spec_for(cfg.workload.kind).worker_imports


def run_with_restarts(group: WorkerGroup, payload: WorkerPayload, max_failures: int) -> Finished:
    """Run ``group`` until it finishes. After a failed attempt the group is stopped, and within
    ``max_failures`` started again: the loop resumes from the latest checkpoint, and rank 0
    counts the restart (``worker/restarts.py``). A run's own verdict (NaN) is never restarted. A
    group whose rendezvous port was taken is started again without counting, at most
    ``PORT_TAKEN_RESTARTS`` times. Raises ``WorkersFailed``; on a stop, the processes are ended
    before the KeyboardInterrupt goes on."""
    failures_left, port_restarts_left = max_failures, PORT_TAKEN_RESTARTS
    while True:
        try:
            outcome = group.run(payload)
        except BaseException:
            group.stop()
            raise
        if isinstance(outcome, Finished):
            return outcome
        group.stop()
        if port_restarts_left > 0 and any(port_taken(e) for e in outcome.values()):
            port_restarts_left -= 1  # the workers never started the loop: nothing to resume
            log.say("rank 0's rendezvous port was taken by another process; starting the "
                    "workers again on another port")  # fmt: skip
        elif failures_left == 0 or any(is_verdict(e) for e in outcome.values()):
            raise WorkersFailed(outcome)
        else:
            failures_left -= 1
            log.say(f"{restart_reason(outcome)}; restarting the workers")
        payload = payload.but(requested_at=time.time())
        group.start()


def restart_reason(failures: Failures) -> str:
    """The failed rank the others follow from (``first_failed``) and its error, in a few
    words."""
    rank = first_failed(failures)
    error = cause(failures[rank])
    if isinstance(error, WorkerDied):
        return str(error)
    return f"rank {rank} failed ({type(error).__name__}: {first_line(error, limit=200)})"


PEER_GONE = re.compile(r"Connection (closed|reset) by peer")
"""gloo's words where a rank's collective lost its peer: a rank that failed and left the group,
or whose process ended."""


def first_failed(failures: Failures) -> int:
    """The rank whose failure the others' follow from: one whose process died, else one whose
    error is not a collective's peer gone, else the first to answer. The order of the answers
    does not tell: a rank that raises leaves the group before it answers, its peers' collective
    fails at once, and answers ready together are read in rank order."""

    def consequence(rank: int) -> tuple[bool, bool]:
        error = cause(failures[rank])
        return not isinstance(error, WorkerDied), bool(PEER_GONE.search(str(error)))

    return min(failures, key=consequence)  # the first of equals: the first to answer


def died(rank: int, pid: int | None, how: str) -> WorkerDied:
    """The one wording of a worker whose process ended mid-run: ``how`` from its exit code
    (``how_it_ended``), or ``ended unexpectedly`` where only its absence is known."""
    process = f"worker process {pid}" if pid is not None else "the worker process"
    return WorkerDied(f"{process} (rank {rank}) {how}")


UNEXPECTEDLY = f"ended unexpectedly ({OUT_OF_MEMORY}; a kill -9; or a crash in native code)"
"""How a worker's end is said where the signal cannot be told (Ray's actors)."""


def how_it_ended(code: int) -> str:
    """A worker process's end, from its return code, in the words a user acts on: a SIGKILL
    nobody here sent is most often the kernel's out-of-memory killer."""
    if code >= 0:
        return f"ended with exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"was killed by signal {-code}"
    if -code == signal.SIGKILL:
        return f"was killed by SIGKILL ({OUT_OF_MEMORY}; or a kill -9)"
    if -code in CRASHES:
        return f"crashed ({name}: a fault in native code, or an abort)"
    return f"was stopped by {name}"


def cause(error: BaseException) -> BaseException:
    """The worker's own exception behind Ray's wrapper (``RayTaskError.cause``)."""
    return getattr(error, "cause", None) or error


def port_taken(error: BaseException) -> bool:
    """Rank 0's TCP store could not listen on the port the group chose: free when it was
    picked, taken by another process before rank 0 bound it. torch 2.13 raises::

        DistNetworkError: The server socket has failed to listen on any local network address.
        port: 39187, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use

    Told by its class's name, as the driver does not import torch."""
    error = cause(error)
    is_dist_network_error = any(c.__name__ == "DistNetworkError" for c in type(error).__mro__)
    return is_dist_network_error and "EADDRINUSE" in str(error)


def is_verdict(error: BaseException) -> bool:
    """The run's own stop (NaN loss): restarting would only repeat it."""
    return isinstance(cause(error), NonFiniteLoss)


def from_ray(error: BaseException, rank: int) -> BaseException:
    """A Ray actor's failure as the worker's own: the exception it raised, or, where its
    process died (killed, crashed), the one wording of a dead worker. Ray cannot tell the
    signal: the likely causes are named."""
    import ray

    if isinstance(error, ray.exceptions.ActorDiedError) and not error.actor_init_failed:
        pid = re.search(r"^\s*pid: (\d+)$", str(error), re.MULTILINE)  # in Ray's message
        return died(rank, int(pid.group(1)) if pid else None, UNEXPECTEDLY)
    return cause(error)
