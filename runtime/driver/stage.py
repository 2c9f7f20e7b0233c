"""The driver's stage runner: where a workload's data stage (``workloads/stage.py``) runs.

Tasks go to the processes the stage finds:
- a GPU stage: one process per GPU for the stage (``stage_processes``), ended with it, so that
  the GPUs are free for the run's workers. Ray starts a new process for every task that asks
  for a GPU (such a task's worker is not reused), which imports torch and makes a CUDA context
  before its work: on an H200 host 10,000 two_moons simulations took 22.4 s by 3 processes,
  milliseconds of it on the GPU;
- a CPU stage on the lasting local cluster: its warm simulators (``warm_pool.simulators``),
  processes that serve one command's stage after another's, where Ray would start new ones for
  every command (their imports: ~3 s of a 2-core CPU before the first task, 7 s of a 16-core
  GPU host);
- else Ray's tasks, each holding the stage's CPUs, in new processes that last as long as the
  command.
At most ``IN_FLIGHT`` tasks per slot are queued: a process finishing one finds the next already
there. A warm simulator or stage process that ends mid-stage is dropped and its tasks go again,
to the others or, with none left, to Ray's tasks; a task that fails fails the stage (a
RecipeError raised in it, such as a broken user simulator, as itself).

A stage of seconds runs in a process of the command's own instead (``start_in_command``),
started before the cluster is reached: on the cluster its first task started a new Ray worker
that imports torch (3.7 s of a warm command on a 2-core CPU, ~12 s of a cold one on an H200
host, for milliseconds of work). It runs in a session of its own: a Ctrl-C reaches the command,
which ends it.

One command at a time makes a stage's output (``one_maker``): runs of one recipe started
together (a sweep of learning rates) each made all of it, at a share of the cluster's pace.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import pickle
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from trainforge import log
from trainforge.driver import cluster, local_cluster
from trainforge.driver.workers import own
from trainforge.errors import RecipeError
from trainforge.worker import task
from trainforge.workloads.stage import Tasks

IN_FLIGHT = 2  # tasks queued per slot: a process finishing one finds the next already there
MAKER_FILE = ".maker.lock"
"""In a stage's folder: locked by the command making it, which wrote its pid there."""
WAIT_SAY_EVERY_S = 10.0
STAGE_PROCESS_START_S = 30.0
"""How long a stage's processes are given to start before those that have not are dropped:
one still waiting then waits for CPUs or a GPU that other work holds."""
POLL_S = 0.05


class Runner:
    """The ``StageRunner`` a command gives its workload's data stage."""

    def resources(self) -> dict[str, float]:
        """The cluster's. Where this command has joined none and would start a private Ray on
        this machine (its workers are its own processes, which need none), this machine's, as
        that Ray counts them, without starting it: a stage found in the cache needs no Ray."""
        imported = sys.modules.get("ray")
        if (imported is None or not imported.is_initialized()) and cluster.private_here():
            return own.resources()
        import ray

        cluster.connect()
        return dict(ray.cluster_resources())

    @contextlib.contextmanager
    def one_maker(self, folder: Path, label: str, say: Callable[[str], None],
                  progress: Callable[[], str]) -> Iterator[None]:  # fmt: skip
        """This command alone makes what goes into ``folder``. Another command making it is
        waited for, saying so with ``progress()`` every ``WAIT_SAY_EVERY_S``; then this one
        makes what is missing (nothing where the other made it all, what it left where it
        stopped). The lock goes with the process (a killed command's too); a file system
        without locks gets none."""
        with open(folder / MAKER_FILE, "a+") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                _wait_for_maker(folder, lock, f"{label}: ", say, progress)
            except OSError:  # no locks here (some network file systems)
                yield
                return
            lock.truncate(0)
            lock.write(f"{os.getpid()}\n")
            lock.flush()
            yield

    def run(self, tasks: Tasks) -> None:
        cluster.connect()
        resources = self.resources()
        slots = _slots(resources, tasks)
        with _processes(tasks, slots, resources) as (members, where):
            if tasks.device == "cuda":
                slots = len(members)
            size = tasks.placed(slots, where)
            _spread(tasks, slots, size, Launcher(tasks, members))

    def start_in_command(self, key: str, function: Callable[..., Any],
                         args: tuple[Any, ...]) -> bool:  # fmt: skip
        if key in _in_command:
            return False
        errors = tempfile.TemporaryFile()  # noqa: SIM115 (it outlives this call: _end closes it)
        process = subprocess.Popen(
            [sys.executable, "-m", task.__name__],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=errors,
            start_new_session=True,  # a Ctrl-C is the command's to handle
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
        assert process.stdin is not None
        with process.stdin:
            process.stdin.write(pickle.dumps((function, args)))
        _in_command[key] = InCommand(process, errors, time.time())
        return True

    def started_in_command(self, key: str) -> float | None:
        started = _in_command.get(key)
        return started.at if started is not None else None

    def wait_in_command(self, key: str, progress: Callable[[], None], every_s: float) -> None:
        started = _in_command[key]
        last = time.monotonic()
        try:
            while started.process.poll() is None:
                time.sleep(POLL_S)
                if time.monotonic() - last >= every_s:
                    last = time.monotonic()
                    progress()
            started.errors.seek(0)
            lines = started.errors.read().decode(errors="replace").strip().splitlines()
        finally:
            _end(key)
        if started.process.returncode != 0:
            why = lines[-1] if lines else f"exit code {started.process.returncode}"
            if why.startswith(task.RECIPE_ERROR):
                raise RecipeError(why.removeprefix(task.RECIPE_ERROR))
            raise RuntimeError(f"the stage on this machine failed: {why}")


def _wait_for_maker(folder: Path, lock: IO[str], prefix: str, say: Callable[[str], None],
                    progress: Callable[[], str]) -> None:  # fmt: skip
    lock.seek(0)
    maker = lock.read().strip() or "?"
    said = time.monotonic()
    say(f"{prefix}another command (pid {maker}) is making these; waiting for it → {folder}")
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(0.2)
        if time.monotonic() - said >= WAIT_SAY_EVERY_S:
            said = time.monotonic()
            say(f"{prefix}waiting for pid {maker}: {progress()}")


def _slots(cluster: dict[str, float], tasks: Tasks) -> int:
    """Tasks the cluster runs at once: its GPUs, or its CPUs over what a task holds."""
    if tasks.device == "cuda":
        return max(1, int(cluster.get("GPU", 0)))
    return max(1, int(cluster.get("CPU", 1) // tasks.cpus))


@contextlib.contextmanager
def _processes(tasks: Tasks, slots: int,
               cluster: dict[str, float]) -> Iterator[tuple[list[Any], str]]:  # fmt: skip
    """The stage's processes and where they are, in words: one per GPU for a GPU stage; the
    lasting local cluster's warm simulators for a CPU stage; else none (Ray's tasks)."""
    from trainforge.driver import warm_pool

    if tasks.device == "cuda":
        with stage_processes(slots, 1, 1, tasks.label) as members:
            where = log.counted(len(members), "GPU", "GPUs")
            if len(members) < slots:
                where += f" of {slots} (the others held by other work at its start)"
            yield members, where
        return
    cpus = cluster.get("CPU", 0)
    where = f"{cpus:g} CPU{'s' * (cpus != 1)}"
    if warm_pool.simulators_unavailable(local_cluster.on_lasting_cluster()):
        yield [], where
        return
    with warm_pool.simulators(slots) as (members, how):
        yield members, f"{where} ({how})" if how else where


class StageProcess:
    """A process that runs a stage's tasks one after another (a GPU stage's)."""

    def run_task(self, function: Callable[..., Any], items: list[Any], args: tuple[Any, ...],
                 env: dict[str, str]) -> tuple[Any, str]:  # fmt: skip
        return task.run(function, items, args, env)


@contextlib.contextmanager
def stage_processes(count: int, num_cpus: float, num_gpus: float = 0,
                    label: str = "stage") -> Iterator[list[Any]]:  # fmt: skip
    """Up to ``count`` ``StageProcess`` actors, each holding ``num_cpus`` and ``num_gpus`` for
    as long as the stage runs; ended with it. As many as the cluster has free at the start, and
    at least one, which waits for its resources: a process waiting for a GPU another run trains
    on would hold up every task given to it until that run ended, where the stage can go on
    with the free GPUs."""
    import ray

    process = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(StageProcess)
    free = ray.available_resources()
    fits = min(
        free.get("CPU", 0) // num_cpus if num_cpus else count,
        free.get("GPU", 0) // num_gpus if num_gpus else count,
    )
    started: list[Any] = [process.remote() for _ in range(max(1, min(count, int(fits))))]
    try:
        what = "a GPU" if num_gpus else "CPUs"
        yield _started(ray, started, f"{label}: waiting for {what}", said=fits < 1)
    finally:
        for member in started:
            with contextlib.suppress(Exception):  # one that ended already
                ray.kill(member, no_restart=True)


def _started(ray: Any, members: list[Any], waiting_for: str, said: bool) -> list[Any]:
    """Those of ``members`` that start within ``STAGE_PROCESS_START_S``, or, where none does,
    the first to start: the free resources counted before their start may have been taken
    since. Says what it waits for, at once where nothing was free (``said``)."""
    waiting = f"{waiting_for} that other work holds on the cluster"
    if said:
        log.say(waiting)
    readiness = {member.__ray_ready__.remote(): member for member in members}
    ready, _ = ray.wait(list(readiness), num_returns=len(readiness),
                        timeout=STAGE_PROCESS_START_S)  # fmt: skip
    if not ready:
        if not said:
            log.say(waiting)
        ready, _ = ray.wait(list(readiness), num_returns=1)
    return [readiness[ref] for ref in ready]


def _spread(tasks: Tasks, slots: int, size: Callable[[int], int], launcher: Launcher) -> None:
    """Every item through tasks, at most ``IN_FLIGHT`` per slot, each task ``size`` items;
    each finished task's result handed to ``tasks.done`` as it arrives."""
    import ray

    queue = deque(tasks.items)
    pending: dict[Any, list[Any]] = {}
    while queue or pending:
        while queue and len(pending) < IN_FLIGHT * slots:
            items = [queue.popleft() for _ in range(size(len(queue)))]
            pending[launcher.submit(items)] = items
        ready, _ = ray.wait(list(pending), num_returns=1)
        items = pending.pop(ready[0])
        try:
            result, worker = _result(ray, ready[0], items, pending)
        except ray.exceptions.RayActorError:
            if not launcher.lost(ready[0]):
                raise
            queue.extendleft(reversed(items))  # its process ended: they go again
            continue
        finally:
            launcher.returned(ready[0])
        tasks.done(items, result, worker)


class Launcher:
    """Where the tasks go: Ray's tasks, each holding the stage's CPUs (or a GPU), or the
    ``members`` (warm simulators, or a GPU stage's processes), which run one task at a time
    each: a task goes to the one with the fewest in flight. A member that ends (killed, out of
    memory) is dropped and its tasks are given again; with none left, the rest go to Ray's
    tasks."""

    def __init__(self, tasks: Tasks, members: list[Any]) -> None:
        import ray

        self.tasks = tasks
        self.members = {member: 0 for member in members}  # member: its tasks in flight
        self.of: dict[Any, Any] = {}  # task: its member
        held = {"num_gpus": 1} if tasks.device == "cuda" else {"num_cpus": tasks.cpus}
        self.task = ray.remote(**held)(task.run)
        self.function = tasks.function
        self.args_ref = ray.put(tasks.args)
        self.env_ref = ray.put(local_cluster.worker_env())

    def submit(self, items: list[Any]) -> Any:
        call = (self.function, items, self.args_ref, self.env_ref)
        if not self.members:
            return self.task.remote(*call)
        member = min(self.members, key=self.members.__getitem__)
        ref = member.run_task.remote(*call)
        self.members[member] += 1
        self.of[ref] = member
        return ref

    def returned(self, ref: Any) -> None:
        """``ref`` is done: its process may take another."""
        member = self.of.pop(ref, None)
        if member in self.members:
            self.members[member] -= 1

    def lost(self, ref: Any) -> bool:
        """``ref`` failed with its actor: was it a member's? It is dropped."""
        member = self.of.get(ref)
        if member is None:
            return False
        if self.members.pop(member, None) is not None:  # once, whatever of its tasks failed
            what = "a GPU's stage process" if self.tasks.device == "cuda" else "a warm simulator"
            log.say(f"{self.tasks.label}: {what} ended; its {self.tasks.noun} go to "
                    f"{'the others' if self.members else 'new Ray workers'}")  # fmt: skip
        return True


def _result(ray: Any, ref: Any, items: list[Any], pending: dict[Any, Any]) -> tuple[Any, str]:
    """A task's result and where it ran; a failed task cancels the others and fails the stage
    (a RecipeError raised in the task, such as a broken user simulator, as itself)."""
    try:
        return tuple(ray.get(ref))  # type: ignore[return-value]
    except ray.exceptions.RayTaskError as exc:
        for other in pending:
            ray.cancel(other)
        if isinstance(exc.cause, RecipeError):
            raise exc.cause from None
        raise RuntimeError(f"a stage task ({items[0]} …) failed: {exc}") from None


@dataclass
class InCommand:
    process: subprocess.Popen[bytes]
    errors: IO[bytes]  # the process's stderr: its traceback, if it fails
    at: float  # time.time() when started


_in_command: dict[str, InCommand] = {}


def _end(key: str) -> None:
    started = _in_command.pop(key, None)
    if started is None:
        return
    if started.process.poll() is None:
        started.process.terminate()
        started.process.wait()
    started.errors.close()


@atexit.register
def _end_all() -> None:
    """A command that fails before it waits (Ray did not start) leaves no process behind."""
    for key in list(_in_command):
        _end(key)
