"""Warm workers: on the lasting local cluster, a run's worker processes outlive it and serve the
next run (``worker/warm.py``).

Ray Train gives every run a controller, a placement group and new worker processes that import
torch and the loop: about 9 s of a 2-core machine's start-up, 20 s on a 4-GPU host (bench/
results, issue 12). On the lasting local cluster — one machine, the default for a local
``trainforge train`` — the run's workers are instead a pool of detached actors kept between
commands: each command claims free slots (a lock file per slot, held while it runs; a dead
command's locks go with it), finds or starts a worker per slot, and runs the same loop in them
over a new gloo process group.

What Ray Train does for a run, done here too: a failed worker ends the whole group and, within
``run.max_failures``, the group restarts from the latest checkpoint; a Ctrl-C stops it; the
workers' errors reach the driver (``WorkersFailed`` carries them rank by rank, as Ray Train's
error does); checkpoints land in the run folder, the newest ``checkpoint.keep_last`` kept.
Warm workers hold no Ray resources while idle, so a simulation stage can use every core
between runs; each ends after ``TRAINFORGE_WARM_IDLE_S`` unused (its memory back to the
machine). A GPU run's warm workers are bound to one GPU each (slot ``n`` to the ``n``-th of
the machine's GPUs) and join an NCCL group; they keep their CUDA context between runs. Remote
storage and clusters joined through RAY_ADDRESS keep Ray Train's worker group.

The pool's other kind: warm simulators (``simulators``), one per CPU slot, which run the CPU
simulation stage's tasks (a user's simulator) for one command after another, so the stage
does not start and import new worker processes every time (Ray gives each command's tasks
processes of their own). Their slots and names (``simulator-<slot>``) are apart from the
workers', so a stage never takes a run's worker, bound to a GPU or not.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import sys
import time
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from trainforge import log, storage
from trainforge.config import Recipe
from trainforge.driver import local_cluster
from trainforge.log import first_line

ENV = "TRAINFORGE_WARM_WORKERS"
"""``0``: every run starts new worker processes through Ray Train, as on any other cluster."""
IDLE_ENV = "TRAINFORGE_WARM_IDLE_S"
"""How long a warm worker waits unused before it ends (its memory back to the machine)."""
DEFAULT_IDLE_S = 600.0
NAMESPACE = "trainforge-warm"
WORKER, SIMULATOR = "worker", "simulator"  # the pool's two kinds of actor, named <kind>-<slot>
OUT_OF_MEMORY = "out of memory: the kernel's OOM killer"  # the likeliest cause of a SIGKILL


class WorkerDied(RuntimeError):
    """A worker's process ended mid-run without an answer (``worded``)."""


class WorkersFailed(Exception):
    """The run's workers failed and no restart is left; ``worker_failures`` maps each failed
    rank to its exception (the attribute Ray Train's ``WorkerGroupError`` has too)."""

    def __init__(self, worker_failures: dict[int, BaseException]) -> None:
        rank, error = next(iter(worker_failures.items()))
        error = _cause(error)
        super().__init__(f"rank {rank}: {type(error).__name__}: {first_line(error, limit=500)}")
        self.worker_failures = worker_failures


@dataclass
class Finished:
    metrics: dict[str, Any]
    checkpoint_path: str | None
    model: bytes | None = None
    """The final model and its input example, pickled, for the command to log to MLflow,
    where rank 0 handed them over (``tracking/relay.py``)."""


def unavailable(cfg: Recipe, storage_path: str, on_lasting_cluster: bool) -> str | None:
    """Why this run cannot use warm workers (None: it can)."""
    why = simulators_unavailable(on_lasting_cluster)  # the pool's own switch and place
    if why is not None:
        return why
    if cfg.scaling.use_gpu == "true" and cfg.scaling.resources_per_worker.get("GPU", 1) != 1:
        return "workers of other than one GPU each"
    if storage.local_folder(storage_path) is None:
        return "remote storage"
    return None


class WarmRun:
    """One command's warm workers, from claiming their slots to releasing them: the MLflow
    calls (``track``: rank 0's process has MLflow imported and its store open, where the driver
    would import it anew) and the run itself (``fit``), with restarts."""

    def __init__(
        self,
        cfg: Recipe,
        payload: dict[str, Any],
        output: Any,
        ahead: dict[str, Any],
        slots: list[int] | None = None,
    ) -> None:
        self.cfg = cfg
        self.ahead = ahead  # this command's workers from ``prestart``, by name
        # given: these slots' workers, unclaimed (a rehearsal: a command that claims one meanwhile
        # waits for the worker's run to end, then takes it); None: free slots, claimed
        self.given_slots = slots
        self.payload = payload  # the command's: the MLflow run it opens reaches the workers
        payload["console_file"] = str(console_file(payload))
        self.output = output
        self.members: list[Any] = []
        self.gpus: list[str] | None = None
        self._held = contextlib.ExitStack()
        self._end_relay: Callable[[], None] = lambda: None  # shows the workers' last lines

    def __enter__(self) -> WarmRun:
        from trainforge.driver import console

        for left in Path(self.payload["run_dir"]).glob(".worker-lines-*"):  # a killed command's
            left.unlink(missing_ok=True)  # (one command per run at a time: run_lock.py)
        self._end_relay = console.relay_file(Path(self.payload["console_file"]), self.output)
        self._held.callback(self._end_relay)
        try:
            self.slots = self.given_slots or self._held.enter_context(
                claimed_slots(self.cfg.scaling.num_workers, living_slots(), gpu_count(self.cfg))
            )
            self.gpus = slot_gpus(self.slots) if self.cfg.scaling.use_gpu == "true" else None
            self.payload["gpus"] = self.gpus  # for the workers' line: which GPUs
            self.members, self.payload["workers_started"] = _members(
                self.slots, self.gpus, self.ahead
            )
        except BaseException:
            self._held.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._held.close()

    def track(self, call: str, *args: Any) -> Any:
        """``tracking.driver.<call>(*args)`` in rank 0's process; here when that one is gone
        (a failed or interrupted run's workers are stopped)."""
        import ray

        from trainforge.tracking import driver as tracking

        if self.members:
            env = local_cluster.worker_env()
            ref = self.members[0].track.remote(call, args, env, self.payload["console_file"])
            with contextlib.suppress(ray.exceptions.RayActorError):
                return ray.get(ref)
        return getattr(tracking, call)(*args)

    def fit(self) -> Finished:
        """Run the loop until it ends; restarts within ``run.max_failures``. Raises
        ``WorkersFailed``, or KeyboardInterrupt after stopping the workers and showing their last
        lines: what the command says next (interrupted, failed) comes after them."""
        import ray

        def stop() -> None:
            _stop(ray, self.members)  # blocked in a collective, or gone: not reusable
            self.members = []

        def start() -> None:
            self.members, self.payload["workers_started"] = _members(self.slots, self.gpus, {})

        try:
            return with_restarts(
                self.cfg.run.max_failures, lambda: _run_once(ray, self.members, self.payload),
                stop, start, self.payload,
            )  # fmt: skip
        except BaseException:
            self._end_relay()  # (at the exit too, where nothing is left to show)
            raise


PORT_TAKEN_RESTARTS = 3
"""How many times a group is started again, beyond ``run.max_failures``, because another
process took its rendezvous port (``_port_taken``): a race a new start is all but sure to win;
where binding keeps failing, the run still ends, with that error."""


def with_restarts(
    max_failures: int,
    run_once: Callable[[], Finished | dict[int, BaseException]],
    stop: Callable[[], None],
    start: Callable[[], None],
    payload: dict[str, Any],
) -> Finished:
    """Run the worker group (``run_once``: ``Finished``, or rank → exception) until it
    finishes. After a failure the group is stopped, and within ``max_failures`` a new one is
    started (``start``) and resumes from the latest checkpoint. A group whose rendezvous port
    was taken is started again on another port without counting as a failure, at most
    ``PORT_TAKEN_RESTARTS`` times. Raises ``WorkersFailed``."""
    failures_left, port_restarts_left = max_failures, PORT_TAKEN_RESTARTS
    while True:
        outcome = run_once()
        if isinstance(outcome, Finished):
            return outcome
        stop()
        if port_restarts_left > 0 and any(_port_taken(e) for e in outcome.values()):
            port_restarts_left -= 1  # the workers never started the loop: nothing to resume
            log.say("rank 0's rendezvous port was taken by another process; starting the "
                    "workers again on another port")  # fmt: skip
        elif failures_left == 0 or any(_is_verdict(e) for e in outcome.values()):
            raise WorkersFailed(outcome)
        else:
            failures_left -= 1
            rank, error = next(iter(outcome.items()))
            log.say(f"rank {rank} failed ({type(_cause(error)).__name__}: "
                    f"{first_line(_cause(error), limit=200)}); restarting the workers")  # fmt: skip
        payload["workers_requested_at"] = time.time()
        start()


def describe() -> list[str]:
    """A line per warm worker and warm simulator of the connected cluster, for ``trainforge
    cluster status``."""
    import ray

    lines = []
    for name in [f"{kind}-{n}" for kind in (WORKER, SIMULATOR) for n in sorted(living_slots(kind))]:
        try:
            info = ray.get(ray.get_actor(name, namespace=NAMESPACE).info.remote(), timeout=2)
        except ray.exceptions.GetTimeoutError:
            lines.append(f"{name}: busy (a run or a simulation stage)")
            continue
        except Exception as exc:  # ended between the listing and the question
            lines.append(f"{name}: gone ({type(exc).__name__})")
            continue
        lines.append(
            f"{name}: pid {info['pid']}, {info['device']}, {info['memory_mb']:,} MB, unused for "
            f"{info['unused_s']} s (ends after {info['idle_limit_s']:.0f} s unused)"
        )
    return lines


def living_slots(kind: str = WORKER) -> set[int]:
    """The slots whose warm worker (``worker-<slot>``), or warm simulator (``kind``
    ``simulator``: ``simulator-<slot>``), is on the connected cluster."""
    import ray

    return {
        int(actor["name"].rsplit("-", 1)[-1])
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == NAMESPACE and actor["name"].startswith(f"{kind}-")
    }


def console_file(payload: dict[str, Any]) -> Path:
    """Where the run's warm workers write their lines (``worker/warm.py``) for this command to
    show (``console.relay_file``); removed at the end."""
    return Path(payload["run_dir"]) / f".worker-lines-{payload['command']}"


def _run_once(ray: Any, members: list[Any], payload: dict[str, Any]) -> Any:
    """One start of the worker group: ``Finished``, or rank → exception for the failed ranks."""
    port = local_cluster.free_port()
    world_size = len(members)
    ranks = {
        member.run.remote(payload, rank, world_size, port, os.getpid()): rank
        for rank, member in enumerate(members)
    }
    results: dict[int, dict[str, Any]] = {}
    pending = list(ranks)
    try:
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                results[ranks[done[0]]] = ray.get(done[0])
            except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as exc:
                rank = ranks[done[0]]
                return {rank: worded(exc, rank)}  # the others may wait in a collective for it
    except BaseException:  # Ctrl-C, SIGTERM: the workers stop with the command
        _stop(ray, members)
        members.clear()
        raise
    return Finished(results[0]["metrics"], results[0]["checkpoint"])


def worded(error: BaseException, rank: int) -> BaseException:
    """A warm worker (or Ray Train's, ``ray_compat.worker_failures``) whose process died
    (killed, crashed) as a command's own worker's death is said (``own_workers.how_it_ended``),
    where Ray's error would say "The actor died unexpectedly before finishing this task." Ray
    cannot tell the signal: the likely causes are named. Any other error is returned as it
    is."""
    if "ray" not in sys.modules:  # no Ray error without Ray: a command's own workers' run
        return error
    import ray

    if not isinstance(error, ray.exceptions.ActorDiedError) or error.actor_init_failed:
        return error
    pid = re.search(r"^\s*pid: (\d+)$", str(error), re.MULTILINE)  # in Ray's message, if known
    process = f"worker process {pid.group(1)}" if pid else "the worker process"
    return WorkerDied(f"{process} (rank {rank}) ended unexpectedly ({OUT_OF_MEMORY}; a kill "
                      "-9; or a crash in native code)")  # fmt: skip


def _stop(ray: Any, members: list[Any]) -> None:
    for member in members:
        with contextlib.suppress(Exception):
            ray.kill(member, no_restart=True)


def slot_gpus(slots: list[int], count: int | None = None) -> list[str]:
    """The GPU of each slot: slot ``n`` has the ``n``-th of this machine's GPUs (those this
    command sees; ``count`` of them where CUDA_VISIBLE_DEVICES does not list them, else the
    connected cluster's), so two commands' workers take different GPUs while there are
    enough."""
    gpus = machine_gpus(count)
    return [gpus[slot % len(gpus)] for slot in slots]


def gpu_count(cfg: Recipe) -> int:
    """How many GPUs the slots of a run of ``cfg`` are bound to (0: a CPU run)."""
    return len(machine_gpus()) if cfg.scaling.use_gpu == "true" else 0


def machine_gpus(count: int | None = None) -> list[str]:
    """The GPUs slots are bound to: those this command sees (CUDA_VISIBLE_DEVICES), else
    ``count`` of them, else the connected cluster's."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
    gpus = [g.strip() for g in visible.split(",") if g.strip()] if visible else []
    if not gpus:
        if count is None:
            import ray

            count = int(ray.cluster_resources().get("GPU", 0))
        gpus = [str(index) for index in range(count)]
    return gpus


def prestart(cfg: Recipe) -> dict[str, Any]:
    """Start now the warm workers the run will need where none is running (``cfg``: its
    workers resolved), so that their imports — torch, the loop, a CUDA context: 15-19 s on a
    4-core GPU host — overlap the data stage (the SBI simulations) instead of following it.
    Returns them by name, for ``WarmRun``. Nothing is claimed here: the run claims its slots
    afterwards and takes these processes (a command that took one of the slots in between
    leaves the run another; a process not taken stays warm for later runs)."""
    import ray

    # free now (released at once), where warm workers live if they can
    with claimed_slots(cfg.scaling.num_workers, living_slots(), gpu_count(cfg)) as slots:
        gpus = slot_gpus(slots) if cfg.scaling.use_gpu == "true" else None
    started: dict[str, Any] = {}
    for index, slot in enumerate(slots):
        name = f"worker-{slot}"
        if _named(ray, name) is None:
            with contextlib.suppress(ValueError):  # the name taken just now by another command
                started[name] = _new_worker(ray, name, gpus[index] if gpus else None)
    if started:
        log.say(f"workers: starting {len(started)} (they stay warm for later runs)")
    first = started.get(f"worker-{slots[0]}") if slots else None  # rank 0, most likely
    if first is not None and cfg.tracking.enabled:  # it creates the MLflow run: open it now
        from trainforge.tracking.client import resolve_uri  # here: a relative path is ours

        first.open_tracking.remote(
            resolve_uri(cfg.tracking.tracking_uri), local_cluster.worker_env()
        )
    return started


def _members(
    slots: list[int], gpus: list[str] | None, ahead: dict[str, Any]
) -> tuple[list[Any], int]:
    """The warm worker of each slot (bound to ``gpus[i]``, or to no GPU): this command's own,
    started ``ahead`` (by ``prestart``; still importing, perhaps), found (and still fit for
    this command) or started; and how many were started (ahead or now)."""
    import ray

    claim = _claim()
    members: list[Any] = []
    started: list[Any] = []
    replaced: list[str] = []
    taken = 0
    for index, slot in enumerate(slots):
        name = f"worker-{slot}"
        gpu = gpus[index] if gpus else None  # slot n's GPU, as prestart computed it
        member = ahead.pop(name, None)
        if member is not None:
            started.append((member, gpu))
            members.append(member)
            taken += 1
            continue
        member = _named(ray, name)
        if member is not None:
            why = _ask(ray, member.serve.remote(*claim, gpu))
            if why is not None:
                replaced.append(why)
                with contextlib.suppress(Exception):
                    ray.kill(member, no_restart=True)
                member = None
        if member is None:
            member = _new_worker(ray, name, gpu)
            started.append((member, gpu))
        members.append(member)
    if replaced:
        log.say(
            f"workers: replacing {log.counted(len(replaced), 'warm worker', 'warm workers')} "
            f"({replaced[0]})"
        )
    if len(started) > taken:
        log.say(f"workers: starting {len(started) - taken} (they stay warm for later runs)")
    if started:  # their imports, in parallel; an import error surfaces here
        ray.get([member.serve.remote(*claim, gpu) for member, gpu in started])
    return members, len(started)


def _claim() -> tuple[list[str], str, int, float]:
    """What a warm worker takes on to serve this command: its Python path, folder, pid, and
    how long to wait unused afterwards."""
    sys_path = [entry for entry in sys.path if entry]
    return sys_path, os.getcwd(), os.getpid(), float(os.environ.get(IDLE_ENV, DEFAULT_IDLE_S))


def _named(ray: Any, name: str) -> Any:
    """The warm worker of that name on the cluster, or None."""
    try:
        return ray.get_actor(name, namespace=NAMESPACE)
    except ValueError:
        return None


def _new_worker(ray: Any, name: str, gpu: str | None) -> Any:
    """A new warm worker process (its imports begin at once); ValueError when the name is taken."""
    from trainforge.worker.warm import WarmWorker

    sys_path, _, pid, idle_s = _claim()
    return _detached(ray, WarmWorker, name).remote(sys_path, pid, idle_s, gpu)


def _detached(ray: Any, cls: type, name: str) -> Any:
    """``cls`` as a named actor of the pool: it outlives the command, holds no Ray resources
    (a simulation stage or Ray Train may use every core between runs) and is never restarted
    by Ray (a dead one is replaced by the next command)."""
    return ray.remote(cls).options(
        name=name, namespace=NAMESPACE, lifetime="detached", num_cpus=0, max_restarts=0,
        get_if_exists=False,
    )  # fmt: skip


ANSWER_S = 30.0
"""How long a warm worker may take to say whether it serves a command: it answers at once unless
it is busy, and a busy worker in a slot this command holds is hung (replaced), or is running a
background start's rehearsal (``rehearsal.py``), which takes as long as a short run: waited for
while the background start runs."""


def _ask(ray: Any, ref: Any) -> str | None:
    """A warm worker's answer to ``serve``: None, or why it cannot serve (a dead or hung one is
    replaced). One busy with a rehearsal is waited for, saying so once."""
    deadline, said = time.monotonic() + ANSWER_S, False
    while True:
        done, _ = ray.wait([ref], timeout=1.0)
        if done:
            try:
                return ray.get(ref)
            except Exception as exc:  # dead: replaced
                return f"it did not answer: {type(exc).__name__}"
        if local_cluster.background_start_running():
            if not said:
                log.say("workers: waiting for the background start to finish its rehearsal of "
                        "this recipe on them")  # fmt: skip
                said = True
            deadline = time.monotonic() + ANSWER_S
        elif time.monotonic() > deadline:
            return f"it did not answer in {ANSWER_S:.0f} s"


def simulators_unavailable(on_lasting_cluster: bool) -> str | None:
    """Why this command's simulation stage cannot use warm simulators (None: it can): the
    pool is switched off or not there; a run's warm workers are ruled out by these too."""
    if os.environ.get(ENV, "1").strip().lower() in ("0", "false", "no", "off"):
        return f"{ENV}=0"
    if not on_lasting_cluster:
        return "not on the lasting local cluster"
    return None


@contextlib.contextmanager
def simulators(count: int) -> Iterator[tuple[list[Any], str]]:
    """``count`` warm simulators (``worker/warm.py``, ``WarmSimulator``) for one command's
    simulation stage, and a few words on how they were found; their slots are held until the
    stage ends. Those living and fit to serve this command are taken, others started: the
    stage's first tasks queue behind their imports. Like a run's warm workers, they hold no
    Ray resources and end after ``TRAINFORGE_WARM_IDLE_S`` unused. A command whose stage
    finds every slot held by another's gets new processes in new slots."""
    import ray

    from trainforge.worker.warm import WarmSimulator

    claim = _claim()
    sys_path, _, pid, idle_s = claim
    with claimed_slots(count, living_slots(SIMULATOR), prefix=SIMULATOR) as slots:
        found = {slot: _named(ray, f"{SIMULATOR}-{slot}") for slot in slots}
        # asked all at once: on a 64-core machine one by one would add up
        asked = {slot: m.serve.remote(*claim, None) for slot, m in found.items() if m is not None}
        members, started, replaced = [], 0, []
        for slot in slots:
            name = f"{SIMULATOR}-{slot}"
            member = found[slot]
            if member is not None:
                why = _ask(ray, asked[slot])
                if why is None:
                    members.append(member)
                    continue
                replaced.append(why)
                with contextlib.suppress(Exception):
                    ray.kill(member, no_restart=True)
            member = _detached(ray, WarmSimulator, name).remote(sys_path, pid, idle_s)
            member.serve.remote(*claim, None)  # this command's folder, before its tasks
            members.append(member)
            started += 1
        warm = len(members) - started
        how = [log.counted(warm, "warm simulator", "warm simulators")] if warm else []
        if started:
            how.append(f"starting {started}; they stay warm for later commands")
        if replaced:
            how.append(f"{len(replaced)} replaced: {replaced[0]}")
        yield members, ", ".join(how)


@contextlib.contextmanager
def claimed_slots(count: int, living: Collection[int] = (), gpus: int = 0,
                  prefix: str = "slot") -> Iterator[list[int]]:  # fmt: skip
    """``count`` slot numbers no other command holds, held until the run ends: the lowest free
    ones, except that a free slot whose warm worker lives (``living``) takes the place of one
    whose worker does not, where both have the same GPU (slot n has GPU n mod ``gpus``; 0: a
    CPU run, any place). A background start that found slots 0-3 held by a running command
    rehearsed its worker in slot 4: the next one-GPU command takes that worker (GPU 0) instead
    of starting another in slot 0. ``prefix``: the lock files' (``simulator``: the warm
    simulators' slots, apart from the workers')."""
    folder = local_cluster.folder() / "warm"
    folder.mkdir(parents=True, exist_ok=True)
    held: dict[int, IO[str]] = {}

    def take(slot: int) -> bool:
        handle = open(folder / f"{prefix}-{slot}.lock", "a")  # noqa: SIM115 - closed below
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            return False
        held[slot] = handle
        return True

    try:
        slot = 0
        while len(held) < count:
            take(slot)
            slot += 1
        chosen = list(held)  # in the order taken: ascending
        for index, slot in enumerate(chosen):
            if slot in living:
                continue
            for other in sorted(set(living) - set(held)):
                if (not gpus or other % gpus == slot % gpus) and take(other):
                    held.pop(slot).close()
                    chosen[index] = other
                    break
        yield chosen
    finally:
        for lock in held.values():
            lock.close()


def _cause(error: BaseException) -> BaseException:
    return getattr(error, "cause", None) or error


def _port_taken(error: BaseException) -> bool:
    """Rank 0's TCP store could not listen on the port ``_run_once`` chose: free when
    ``local_cluster.free_port`` released it, taken by another process before rank 0 bound it.
    torch 2.13 raises (as itself from a command's own worker, as the cause of Ray's
    ``RayTaskError`` from a warm one)::

        DistNetworkError: The server socket has failed to listen on any local network address.
        port: 39187, useIpv6: false, code: -98, name: EADDRINUSE, message: address already in use

    Told by its class's name, as the driver does not import torch."""
    cause = _cause(error)
    is_dist_network_error = any(c.__name__ == "DistNetworkError" for c in type(cause).__mro__)
    return is_dist_network_error and "EADDRINUSE" in str(cause)


def _is_verdict(error: BaseException) -> bool:
    """The run's own stop (NaN loss): restarting would only repeat it."""
    from trainforge.errors import NonFiniteLoss

    return isinstance(_cause(error), NonFiniteLoss)
