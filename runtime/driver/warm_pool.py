"""Warm workers: on the lasting local cluster, a run's worker processes outlive it and serve the
next run (``worker/warm.py``), and warm simulators serve the next simulation stage.

Ray Train gives every run a controller, a placement group and new worker processes that import
torch and the loop: about 9 s of a 2-core machine's start-up, 20 s on a 4-GPU host. On the
lasting local cluster — one machine, the default for a local ``trainforge train`` — the run's
workers are instead a pool of detached actors kept between commands: each command claims free
slots (a lock file per slot, held while it runs; a dead command's locks go with it), finds or
starts a worker per slot (``members``), and runs the same loop in them
(``driver/workers/warm.py``). Warm workers hold no Ray resources while idle, so a simulation
stage can use every core between runs; each ends after ``TRAINFORGE_WARM_IDLE_S`` unused (its
memory back to the machine). A GPU run's warm workers are bound to one GPU each (slot ``n`` to
the ``n``-th of the machine's GPUs) and keep their CUDA context between runs. Remote storage
and clusters joined through RAY_ADDRESS keep Ray Train's worker group.

A warm tracker (``tracker``, ``driver/warm_tracker.py``) makes and ends the MLflow runs of
commands on warm workers, with MLflow imported once.

The pool's other kind: warm simulators (``simulators``), one per CPU slot, which run the CPU
simulation stage's tasks (a user's simulator) for one command after another, so the stage does
not start and import new processes every time. Their slots and names (``simulator-<slot>``) are
apart from the workers', so a stage never takes a run's worker, bound to a GPU or not.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import IO, Any

from trainforge import log, settings, storage
from trainforge.config import Recipe
from trainforge.driver import local_cluster
from trainforge.worker.payload import WorkerPayload

NAMESPACE = "trainforge-warm"
WORKER, SIMULATOR, TRACKER = "worker", "simulator", "tracker"  # its actors: <kind>-<slot>


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


def describe() -> list[str]:
    """A line per warm worker, warm tracker and warm simulator of the connected cluster, for
    ``trainforge cluster status``."""
    import ray

    lines = []
    kinds = (WORKER, TRACKER, SIMULATOR)
    for name in [f"{kind}-{n}" for kind in kinds for n in sorted(living_slots(kind))]:
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


def console_file(payload: WorkerPayload) -> Path:
    """Where the run's workers write their lines (``worker/warm.py``) for this command to show
    (``console.relay_file``); removed at the end."""
    return Path(payload.run_dir) / f".worker-lines-{payload.command}"


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
    Returns them by name, for the run's group (``driver/workers/warm.py``). Nothing is claimed
    here: the run claims its slots afterwards and takes these processes (a command that took
    one of the slots in between leaves the run another; a process not taken stays warm for
    later runs)."""
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
    if cfg.tracking.enabled:
        with claimed_slots(1, living_slots(TRACKER), prefix=TRACKER) as (slot,):
            name = f"{TRACKER}-{slot}"
        if _named(ray, name) is None:
            with contextlib.suppress(ValueError):
                started[name] = _new_tracker(ray, name)
    return started


def _new_tracker(ray: Any, name: str) -> Any:
    """A new warm tracker process (its imports begin at once); ValueError when the name is
    taken."""
    from trainforge.driver.warm_tracker import WarmTracker

    sys_path, _, pid, idle_s = _claim()
    return _detached(ray, WarmTracker, name).remote(sys_path, pid, idle_s)


@contextlib.contextmanager
def tracker(ahead: dict[str, Any], claim: bool = True) -> Iterator[Any]:
    """The warm tracker for one command's MLflow run: this command's own, started ``ahead`` (by
    ``prestart``), found fit to serve it, or started now; its slot held until the run's end.
    A rehearsal's (``claim`` false) is its own, unclaimed, as its workers are."""
    import ray

    claim_args = _claim()
    own = sorted(int(name.rsplit("-", 1)[1]) for name in ahead if name.startswith(TRACKER))
    slots = (claimed_slots(1, living_slots(TRACKER), prefix=TRACKER) if claim
             else contextlib.nullcontext(own[:1] or [0]))  # fmt: skip
    with slots as (slot,):
        name = f"{TRACKER}-{slot}"
        member = ahead.pop(name, None)
        new = member is not None
        if member is None:
            member = _named(ray, name)
            why = _ask(ray, member.serve.remote(*claim_args, None)) if member else None
            if why is not None:
                log.say(f"mlflow: replacing the warm tracker ({why})")
                with contextlib.suppress(Exception):
                    ray.kill(member, no_restart=True)
                member = None
        if member is None:
            member, new = _new_tracker(ray, name), True
        if new:  # this command's, before its run begins (its calls run in order)
            member.serve.remote(*claim_args, None)
        yield member


def members(
    slots: list[int], gpus: list[str] | None, ahead: dict[str, Any]
) -> tuple[list[Any], int]:
    """The warm worker of each slot (bound to ``gpus[i]``, or to no GPU): this command's own,
    started ``ahead`` (by ``prestart``; still importing, perhaps), found (and still fit for
    this command) or started; and how many were started (ahead or now)."""
    import ray

    claim = _claim()
    found: list[Any] = []
    started: list[Any] = []
    replaced: list[str] = []
    taken = 0
    for index, slot in enumerate(slots):
        name = f"worker-{slot}"
        gpu = gpus[index] if gpus else None  # slot n's GPU, as prestart computed it
        member = ahead.pop(name, None)
        if member is not None:
            started.append((member, gpu))
            found.append(member)
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
            member = _new_worker_once_free(ray, name, gpu)
            started.append((member, gpu))
        found.append(member)
    if replaced:
        log.say(
            f"workers: replacing {log.counted(len(replaced), 'warm worker', 'warm workers')} "
            f"({replaced[0]})"
        )
    if len(started) > taken:
        log.say(f"workers: starting {len(started) - taken} (they stay warm for later runs)")
    if started:  # their imports, in parallel; an import error surfaces here
        ray.get([member.serve.remote(*claim, gpu) for member, gpu in started])
    return found, len(started)


def _claim() -> tuple[list[str], str, int, float]:
    """What a warm worker takes on to serve this command: its Python path, folder, pid, and
    how long to wait unused afterwards."""
    sys_path = [entry for entry in sys.path if entry]
    return sys_path, os.getcwd(), os.getpid(), settings.WARM_IDLE_S.seconds()


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


def _new_worker_once_free(ray: Any, name: str, gpu: str | None) -> Any:
    """A new warm worker in this command's slot, once the name is free: a worker killed just
    now (replaced here, or by a stopped command) holds its name for a moment after
    ``ray.kill`` returns, and creating one by that name then fails."""
    deadline = time.monotonic() + NAME_RELEASE_S
    while True:
        try:
            return _new_worker(ray, name, gpu)
        except ValueError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _detached(ray: Any, cls: type, name: str) -> Any:
    """``cls`` as a named actor of the pool: it outlives the command, holds no Ray resources
    (a simulation stage or Ray Train may use every core between runs) and is never restarted
    by Ray (a dead one is replaced by the next command)."""
    return ray.remote(cls).options(
        name=name, namespace=NAMESPACE, lifetime="detached", num_cpus=0, max_restarts=0,
        get_if_exists=False,
    )  # fmt: skip


NAME_RELEASE_S = 15.0
"""How long a killed warm worker's name may take to be free for a new one."""

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
    if not settings.warm_pool():
        return f"{settings.WORKERS.name}={settings.workers()}"
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
