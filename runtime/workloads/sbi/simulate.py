"""The simulation stage: N (θ, x) pairs, simulated once and kept in a hash-addressed cache.

The N simulations are cut into chunks with one seed each, so the result does not depend on how
many machines ran them (``chunking.py``: chunk sizes depend on N and the recipe only). Ray tasks
simulate them — each holding one CPU (``cpus_per_chunk``) for ordinary simulators, one GPU for
vectorised torch simulators when the cluster has GPUs — a few chunks per task, sized from the
cluster's slots and the simulator's measured cost so that every core of every node stays busy
to the end; on the lasting local cluster a CPU stage's tasks run in its warm simulators
instead (``warm_pool.simulators``: processes that serve one command's stage after another's,
where Ray would start new ones for every command), and a GPU stage's in one process per GPU
that ends with the stage (``stage_processes``). The driver writes each finished chunk to
``<cache>/<key>/chunk-NNNNNN.pt`` (write to a temporary name, then rename, so a file that
exists is complete). ``manifest.json`` is written last: its presence means the entry is
whole. Interrupted, the stage resumes by simulating only the missing chunks.

A simulation is invalid when its x holds NaN or inf, or when a per-sample simulator raised on
its parameters (``sources.Failures``: x is stored as NaN); the manifest counts both, and the
recipe drops them or stops (``drop_invalid``). Each chunk also records the node and process
that simulated it, so the manifest says where the work ran.

The key hashes what determines the data: the task (or the user's prior and simulator, with a
digest of their source code), N, the chunk size, the seed and the simulating device (CPU and
CUDA generators give different streams).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import numpy as np

from trainforge import log, storage
from trainforge.atomic import replacing
from trainforge.errors import RecipeError
from trainforge.workloads.sbi import catalogue, chunking

if TYPE_CHECKING:  # torch and the sources' module (torch) only where simulations are made or read
    import torch

    from trainforge.workloads.sbi import sources

FORMAT = 1  # bump when the chunk layout changes, so old entries are not misread
MANIFEST = "manifest.json"
PROGRESS_EVERY_S = 5.0
WRITERS = 8  # threads writing chunk files (each flushed to disk) while tasks run


@dataclass
class Plan:
    folder: Path
    key: str
    spec: dict[str, Any]
    chunks: list[tuple[int, int]]  # (index, size)
    device: str

    @property
    def rows_per_chunk(self) -> int:
        return int(self.spec["chunk_size"])

    def chunk_path(self, index: int) -> Path:
        return chunk_file(self.folder, index)

    def missing(self) -> list[tuple[int, int]]:
        return [(i, n) for i, n in self.chunks if not self.chunk_path(i).is_file()]


def cache_root(cfg: Any, storage_root: str) -> Path:
    if cfg.simulation.cache_dir:
        return Path(cfg.simulation.cache_dir).expanduser().resolve()
    if storage.is_uri(storage_root):
        raise RecipeError(
            "workload.simulation.cache_dir: run.storage_path is a URI; set cache_dir to a shared "
            "file system path for the simulations"
        )
    return Path(storage_root) / "simulations"


def simulation_device(cfg: Any, source: catalogue.SourceFacts | sources.SimulationSource,
                      cluster_gpus: float) -> str:  # fmt: skip
    choice = cfg.simulation.device
    if choice not in ("auto", "cpu", "cuda"):
        raise RecipeError(f"workload.simulation.device: {choice!r} is not one of auto, cpu, cuda")
    if choice == "cuda" and (cluster_gpus < 1 or not source.vectorized):
        why = "the Ray cluster has no GPU" if cluster_gpus < 1 else "the simulator is not torch"
        raise RecipeError(f"workload.simulation.device: cuda, but {why}")
    if choice == "auto":
        return "cuda" if source.vectorized and cluster_gpus >= 1 else "cpu"
    return choice


def plan(cfg: Any, source: catalogue.SourceFacts | sources.SimulationSource, seed: int, root: Path,
         device: str) -> Plan:  # fmt: skip
    sim = cfg.simulation
    rows = chunking.chunk_rows(sim.num_simulations, sim.chunk_size, source.vectorized)
    spec = {
        "format": FORMAT,
        "source": source.fingerprint,
        "num_simulations": sim.num_simulations,
        "chunk_size": rows,
        "seed": seed,
        "device": device,
    }
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]
    name = source.name.replace(":", "-").replace("/", "-").replace(".", "-")
    folder = root / f"{name}-{key}"
    sizes = chunking.chunk_sizes(sim.num_simulations, rows)
    return Plan(folder, key, spec, list(enumerate(sizes)), device)


def chunk_file(folder: Path, index: int) -> Path:
    return folder / f"chunk-{index:06d}.pt"


def chunk_seed(seed: int, index: int) -> int:
    return int(np.random.SeedSequence([seed, index]).generate_state(1, dtype=np.uint64)[0] >> 1)


_sources: dict[str, sources.SimulationSource] = {}


def _source(cfg: Any) -> sources.SimulationSource:
    """The recipe's source, resolved once per process: a Ray worker runs many tasks of one
    stage, and resolving imports the user's code and probes it."""
    from trainforge.workloads.sbi import sources

    key = json.dumps([cfg.task, cfg.prior, cfg.simulator, cfg.code_dir, cfg.vectorized])
    if key not in _sources:
        _sources[key] = sources.resolve(cfg)
    return _sources[key]


def simulate_chunk(cfg: Any, seed: int, index: int, size: int, device: str) -> dict[str, Any]:
    """One chunk: θ from the prior, x from the simulator; NaN/inf and raised rows counted."""
    return simulate_chunk_list(cfg, seed, [(index, size)], device)[0]


def simulate_chunk_list(
    cfg: Any, seed: int, chunks: list[tuple[int, int]], device: str
) -> list[dict[str, Any]]:
    """``simulate_chunk`` for each of ``chunks``. On the CPU every chunk's θ is drawn first and
    the simulator then runs on one chunk after another: the prior's torch code between two
    simulator calls slowed a per-sample simulator by ~1% (bench/results, thirty-ninth
    session). The values are each chunk's alone: before its simulator, the global RNGs are
    where its own seed and prior draw left them."""
    import torch

    # as many threads as the task holds CPUs (one by default), whatever the environment says:
    # more would compete with the other tasks on the machine
    threads = (
        cfg.simulation.cpus_per_chunk if device == "cpu" else os.environ.get("OMP_NUM_THREADS")
    )
    torch.set_num_threads(max(1, int(float(threads or 1))))
    source = _source(cfg)
    with torch.no_grad():
        if device == "cpu":
            drawn = [_draw(source, seed, index, size, device) for index, size in chunks]
            made = [_simulate(source, chunk) for chunk in drawn]
        else:
            # a GPU chunk is large (one vectorised call): nothing to gain, and its CUDA RNG is
            # seeded with the CPU's by torch.manual_seed, which the next chunk's draw resets
            made = [_simulate(source, _draw(source, seed, i, n, device)) for i, n in chunks]
    return [_checked(*chunk) for chunk in made]


@dataclass
class _Drawn:
    """A chunk's θ and the RNG states its simulator continues from."""

    seed: int
    theta: torch.Tensor
    generator: torch.Generator  # a built-in task's: its prior and simulator draw from it
    cpu_rng: torch.Tensor  # the global CPU generator's state after the prior's draw
    seconds: float


def _draw(source: sources.SimulationSource, seed: int, index: int, size: int,
          device: str) -> _Drawn:  # fmt: skip
    import torch

    s = chunk_seed(seed, index)
    # user priors/simulators draw from the global RNGs. On the CPU only its generator:
    # torch.manual_seed also queues a seed for CUDA's lazy start, formatting the call stack
    # each time, and cost a per-sample simulator's 16-row chunks ~2% (bench/results,
    # thirty-eighth session)
    if device == "cpu":
        torch.default_generator.manual_seed(s)
    else:
        torch.manual_seed(s)
    generator = torch.Generator(device=device).manual_seed(s)
    started = time.perf_counter()
    theta = source.sample_prior(size, generator)
    return _Drawn(s, theta, generator, torch.get_rng_state(), time.perf_counter() - started)


def _simulate(
    source: sources.SimulationSource, chunk: _Drawn
) -> tuple[torch.Tensor, torch.Tensor, sources.Failures, float]:
    """(θ, x, the rows that raised, seconds of the prior's draw and the simulator)."""
    import torch

    torch.set_rng_state(chunk.cpu_rng)
    np.random.seed(chunk.seed % 2**32)
    started = time.perf_counter()
    theta = chunk.theta
    x, failures = source.simulate_recording(
        theta if source.vectorized else theta.cpu(), chunk.generator
    )
    return theta, x, failures, chunk.seconds + time.perf_counter() - started


def _checked(
    theta: torch.Tensor, x: torch.Tensor, failures: sources.Failures, seconds: float
) -> dict[str, Any]:
    """A chunk's result: float32 CPU tensors, its invalid rows counted."""
    import torch

    return {
        "theta": theta.float().cpu().contiguous(),
        "x": x.float().cpu().contiguous(),
        "invalid": int((~torch.isfinite(x).all(dim=1)).sum()),
        "failed": len(failures.rows),
        "first_failure": failures.first,
        "seconds": seconds,
    }


def simulate_chunks(
    cfg: Any, seed: int, chunks: list[tuple[int, int]], device: str,
    env: dict[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """One Ray task: a few chunks, tagged with the node and process that simulated them, with
    the command's environment ``env`` (``local_cluster.worker_env``: a user's simulator may
    read variables of its own, and the process may be the lasting cluster's). Their θ and x
    go back as one tensor each (``unpack`` cuts them apart): pickling a tensor costs ~0.1 ms,
    and two per 16-row chunk of a per-sample simulator were ~0.5% of its work, paid while the
    task's core waits (bench/results, thirty-ninth session)."""
    import ray

    from trainforge.worker import settings

    worker = f"{ray.get_runtime_context().get_node_id()}:{os.getpid()}"
    with settings.applied(env or {}):
        return pack(simulate_chunk_list(cfg, seed, chunks, device), worker)


def pack(results: list[dict[str, Any]], worker: str) -> dict[str, Any]:
    """``simulate_chunk``'s results as one θ, one x and the rest of each chunk's result."""
    import torch

    return {
        "theta": torch.cat([r["theta"] for r in results]),
        "x": torch.cat([r["x"] for r in results]),
        "rows": [len(r["x"]) for r in results],
        "chunks": [{k: v for k, v in r.items() if k not in ("theta", "x")} for r in results],
        "worker": worker,
    }


def unpack(task: dict[str, Any]) -> list[dict[str, Any]]:
    """A task's result as ``simulate_chunk``'s, one per chunk, each with its own θ and x (copies:
    ``torch.save`` of a slice would write the whole task's tensor into every chunk file)."""
    thetas, xs = task["theta"].split(task["rows"]), task["x"].split(task["rows"])
    return [
        chunk | {"theta": theta.clone(), "x": x.clone(), "worker": task["worker"]}
        for chunk, theta, x in zip(task["chunks"], thetas, xs, strict=True)
    ]


HERE_MAX_SECONDS = 8.0
"""A built-in task's stage is made without the cluster (``simulate_here.py``) when one CPU core
takes at most this long: the cluster's new worker processes take about as long to start."""


def simulates_here(cfg: Any) -> bool:
    """Is the stage made by the command itself (``workload.simulation.where``)?"""
    where = cfg.simulation.where
    if where != "auto":
        return bool(where == "here")
    if cfg.task == catalogue.CUSTOM or cfg.simulation.device == "cuda":
        return False  # a user's simulator's cost is unknown until it runs
    per_million = catalogue.TASK_SHAPES[cfg.task].cpu_seconds_per_million
    return cfg.simulation.num_simulations / 1e6 * per_million <= HERE_MAX_SECONDS


def start_early(cfg: Any, seed: int, storage_root: str) -> None:
    """Start a built-in task's stage before the cluster is reached, where it needs none
    (``simulates_here``) and the cache does not hold it yet; ``run`` then waits for it."""
    if cfg.simulation.path is not None or cfg.task == catalogue.CUSTOM or not simulates_here(cfg):
        return  # a user's simulator made here (where: here) starts in ``run``, with its code_dir
    job = plan(cfg, facts(cfg), seed, cache_root(cfg, storage_root), "cpu")
    if not (job.folder / MANIFEST).is_file():
        from trainforge.workloads.sbi import simulate_here

        begin(job)
        simulate_here.start(cfg, seed, job)


def run(cfg: Any, seed: int, storage_root: str, quiet: bool = False) -> Path:
    """Make sure the recipe's simulations exist; return their folder. Needs a connected Ray,
    unless the stage is made here (``simulates_here``)."""
    source = facts(cfg)
    here = simulates_here(cfg)
    if here:
        cluster: dict[str, float] = {}
        device = "cpu"
    else:
        import ray

        cluster = ray.cluster_resources()
        device = simulation_device(cfg, source, cluster.get("GPU", 0))
    job = plan(cfg, source, seed, cache_root(cfg, storage_root), device)
    say = (lambda _: None) if quiet else log.say
    if (job.folder / MANIFEST).is_file() and not (here and _started_early(job)):
        say(f"simulations: reusing {job.folder}")
        return job.folder
    begin(job)
    if here:
        total = cfg.simulation.num_simulations
        progress = Progress(total, total - sum(n for _, n in job.missing()), say)
        _make_here(cfg, seed, job, progress, source.name)
        return job.folder
    with making(job, say) as made_by_another:
        if made_by_another:
            say(f"simulations: reusing {job.folder}")
            return job.folder
        _make_on_cluster(cfg, seed, job, device, cluster, source.name, say)
    return job.folder


def _make_on_cluster(cfg: Any, seed: int, job: Plan, device: str, cluster: dict[str, float],
                     name: str, say: Callable[[str], None]) -> None:  # fmt: skip
    """The chunks not on disk, spread over the cluster's CPUs (or GPUs); the manifest last."""
    todo = job.missing()
    total = cfg.simulation.num_simulations
    progress = Progress(total, total - sum(n for _, n in todo), say)
    slots = chunking.slots(cluster, device, cfg.simulation.cpus_per_chunk)
    cpus = cluster.get("CPU", 0)
    with _simulators(device, slots) as (members, how):
        where = f"{cpus:g} CPU{'s' * (cpus != 1)}"
        if device == "cuda":  # the GPUs free at the stage's start (``stage_processes``)
            where = log.counted(len(members), "GPU", "GPUs")
            if len(members) < slots:
                where += f" of {slots} (the others held by other work at its start)"
            slots = len(members)
        progress.slots = slots
        say(
            f"simulations: {len(todo)} of {len(job.chunks)} chunks of {job.rows_per_chunk:,} "
            f"to simulate for {total:,} {name} simulations on {where}"
            + (f" ({how})" if how else "")
            + f" → {job.folder}"
            + (f" (resuming: {progress.done:,} done)" if progress.done else "")
        )
        done = _spread(cfg, seed, job, todo, slots, progress, members)
    progress.finish(finish(job, done))


MAKER_FILE = ".maker.lock"
"""In a cache entry: locked by the command making its simulations, which wrote its pid there."""
WAIT_SAY_EVERY_S = 10.0


@contextlib.contextmanager
def making(job: Plan, say: Callable[[str], None]) -> Iterator[bool]:
    """This command alone makes ``job``'s simulations. Another command making the same ones
    (runs of one recipe started together: a sweep of learning rates) is waited for, with its
    progress on disk; yields True where it made them all, False where this command is to make
    what is missing (all of them, or what another left when it stopped: resumed from its
    chunks). Without the lock both made every chunk, each at half the cluster's pace. The lock
    goes with the process (a killed command's too); a file system without locks gets none."""
    with open(job.folder / MAKER_FILE, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            _wait_for_maker(job, lock, say)
        except OSError:  # no locks here (some network file systems)
            yield False
            return
        lock.truncate(0)
        lock.write(f"{os.getpid()}\n")
        lock.flush()
        yield (job.folder / MANIFEST).is_file()


def _wait_for_maker(job: Plan, lock: IO[str], say: Callable[[str], None]) -> None:
    lock.seek(0)
    maker = lock.read().strip() or "?"
    said = time.monotonic()
    say(f"simulations: another command (pid {maker}) is making these; waiting for it → "
        f"{job.folder}")  # fmt: skip
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            time.sleep(0.2)
        if time.monotonic() - said >= WAIT_SAY_EVERY_S:
            said = time.monotonic()
            on_disk = len(job.chunks) - len(job.missing())
            say(f"simulations: waiting for pid {maker}: {on_disk}/{len(job.chunks)} chunks on disk")


@contextlib.contextmanager
def _simulators(device: str, slots: int) -> Iterator[tuple[list[Any], str]]:
    """Where the stage's tasks run, and how they were found: a GPU stage in one process per
    GPU for the stage (``stage_processes``); a CPU stage in the lasting local cluster's warm
    simulators (``warm_pool.simulators``), one per slot; else none: the stage's Ray tasks
    start new worker processes, which last as long as this command."""
    from trainforge.driver import cluster, warm_pool

    if device == "cuda":
        with stage_processes(slots, num_cpus=1, num_gpus=1) as members:
            yield members, ""
        return
    if warm_pool.simulators_unavailable(cluster.on_lasting_cluster()):
        yield [], ""
        return
    with warm_pool.simulators(slots) as found:
        yield found


class StageSimulator:
    """A process that simulates a stage's tasks one after another (``Launcher``'s member). Ray
    starts a new process for every task that asks for a GPU (such a task's worker is not
    reused), which imports torch and makes a CUDA context before its chunks: on an H200 host
    10,000 two_moons simulations took 22.4 s by 3 processes, milliseconds of it on the GPU
    (bench/results, forty-eighth session)."""

    def simulate(self, cfg: Any, seed: int, chunks: list[tuple[int, int]], device: str,
                 env: dict[str, str]) -> dict[str, Any]:  # fmt: skip
        return simulate_chunks(cfg, seed, chunks, device, env)


STAGE_PROCESS_START_S = 30.0
"""How long a stage's processes are given to start before those that have not are dropped:
one still waiting then waits for CPUs or a GPU that other work holds."""


@contextlib.contextmanager
def stage_processes(count: int, num_cpus: float, num_gpus: float = 0) -> Iterator[list[Any]]:
    """Up to ``count`` ``StageSimulator`` processes, each holding ``num_cpus`` and ``num_gpus``
    for as long as the stage runs; ended with it, so that the GPUs are free for the run's
    workers. As many as the cluster has free at the start, and at least one, which waits for
    its resources: a process waiting for a GPU another run trains on would hold up every task
    given to it until that run ended, where the stage can go on with the free GPUs."""
    import ray

    simulator = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus)(StageSimulator)
    free = ray.available_resources()
    fits = min(
        free.get("CPU", 0) // num_cpus if num_cpus else count,
        free.get("GPU", 0) // num_gpus if num_gpus else count,
    )
    started: list[Any] = [simulator.remote() for _ in range(max(1, min(count, int(fits))))]
    try:
        yield _started(ray, started, "a GPU" if num_gpus else "CPUs", said=fits < 1)
    finally:
        for member in started:
            with contextlib.suppress(Exception):  # one that ended already
                ray.kill(member, no_restart=True)


def _started(ray: Any, members: list[Any], what: str, said: bool) -> list[Any]:
    """Those of ``members`` that start within ``STAGE_PROCESS_START_S``, or, where none does,
    the first to start: the free resources counted before their start may have been taken
    since. Says what it waits for, at once where nothing was free (``said``)."""
    waiting = f"simulations: waiting for {what} that other work holds on the cluster"
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


def _make_here(cfg: Any, seed: int, job: Plan, progress: Progress, name: str) -> None:
    """The stage in the command's own process on this machine (``simulate_here.py``): started
    by ``start_early`` while Ray started, or now."""
    from trainforge.workloads.sbi import simulate_here

    total = cfg.simulation.num_simulations
    early = not simulate_here.start(cfg, seed, job)
    resumed = simulate_here.rows_before(job)  # not progress.done: the early process's rows
    progress.say(
        f"simulations: {total - resumed:,} {name} simulations "
        f"on this machine's CPU{' (started while the cluster was reached)' if early else ''}"
        f" → {job.folder}" + (f" (resuming: {resumed:,} done)" if resumed else "")
    )

    def on_disk(simulations: int) -> None:
        progress.say(f"simulations: {simulations:,}/{total:,} ({simulations / total:.0%})")

    seconds = simulate_here.wait(job, on_disk)
    manifest = read_manifest(job.folder)
    progress.say(
        f"simulations: {total - resumed:,} in {seconds:.1f} s by this command's own process "
        "(one CPU core)"
    )
    if manifest["invalid"]:
        progress.say(f"simulations: {invalid_summary(manifest)}")


def _started_early(job: Plan) -> bool:
    from trainforge.workloads.sbi import simulate_here

    return simulate_here.started(job)


def begin(job: Plan) -> None:
    """The entry's folder, with the spec its key hashes (for whoever looks at the cache)."""
    job.folder.mkdir(parents=True, exist_ok=True)
    _write_json(job.folder / "spec.json", job.spec)


def finish(job: Plan, done: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Write the manifest, last: the entry is whole. ``done``: the chunks just simulated."""
    manifest = summarize(job, done)
    _write_json(job.folder / MANIFEST, manifest)
    return manifest


def facts(cfg: Any) -> catalogue.SourceFacts | sources.SimulationSource:
    """The recipe's source as the stage plans it: a built-in task's from the catalogue (no
    torch in the driver); a user's prior and simulator imported and probed."""
    if cfg.task != catalogue.CUSTOM:
        return catalogue.builtin(cfg.task)
    from trainforge.workloads.sbi import sources

    return sources.resolve(cfg)


def _spread(
    cfg: Any, seed: int, job: Plan, todo: list[tuple[int, int]], slots: int, progress: Progress,
    members: list[Any],
) -> dict[int, dict[str, Any]]:  # fmt: skip
    """Every missing chunk through Ray tasks (or the warm simulators ``members``:
    ``Launcher``), at most IN_FLIGHT per slot, each task sized by ``chunking.TaskSizer``;
    each finished chunk is written as it arrives, by a few writer threads (each file is
    flushed to disk, milliseconds apiece: one thread could not keep up with many cores).
    Returns what the manifest needs of each chunk simulated (so it need not read them back).
    Leaving, it waits for the writes: what was simulated is on disk."""
    import ray

    launcher = Launcher(ray, cfg, seed, job.device, members)
    queue = deque(todo)
    sizer = chunking.TaskSizer(slots, job.rows_per_chunk)
    pending: dict[Any, list[tuple[int, int]]] = {}
    done: dict[int, dict[str, Any]] = {}
    with ThreadPoolExecutor(WRITERS, thread_name_prefix="chunk-writer") as writers:
        writes = []
        while queue or pending:
            while queue and len(pending) < chunking.IN_FLIGHT * slots:
                chunks = [queue.popleft() for _ in range(sizer.next_size(len(queue)))]
                pending[launcher.submit(chunks)] = chunks
            ready, _ = ray.wait(list(pending), num_returns=1)
            chunks = pending.pop(ready[0])
            try:
                results = unpack(_result(ray, ready[0], chunks, pending))
            except ray.exceptions.RayActorError:
                if not launcher.lost(ready[0]):
                    raise
                queue.extendleft(reversed(chunks))  # a warm simulator ended: they go again
                continue
            finally:
                launcher.returned(ready[0])
            for (index, _), result in zip(chunks, results, strict=True):
                writes.append(writers.submit(save_chunk, result, job.chunk_path(index)))
                done[index] = chunk_facts(result)
            simulated = sum(len(r["x"]) for r in results)
            seconds = sum(r["seconds"] for r in results)
            sizer.record(simulated, seconds)
            # a GPU chunk's seconds are its launches' (the copy to the CPU waits for the work)
            progress.add(simulated, {r["worker"] for r in results},
                         seconds if job.device == "cpu" else 0.0)  # fmt: skip
        for write in writes:
            write.result()  # a write that failed fails the stage
    return done


class Launcher:
    """Where the stage's tasks run: Ray tasks, each holding its chunks' CPUs (or a GPU), or the
    ``members`` (warm simulators, or a GPU stage's processes), which run one task at a time
    each: a task goes to the one with the fewest in flight. A member that ends (killed, out of
    memory) is dropped and its tasks are given again; with none left, the rest go to Ray
    tasks."""

    def __init__(self, ray: Any, cfg: Any, seed: int, device: str, members: list[Any]) -> None:
        self.ray, self.seed, self.device = ray, seed, device
        self.members = {member: 0 for member in members}  # member: its tasks in flight
        self.of: dict[Any, Any] = {}  # task: its member
        if device == "cuda":
            self.task = ray.remote(num_gpus=1)(simulate_chunks)
        else:
            self.task = ray.remote(num_cpus=cfg.simulation.cpus_per_chunk)(simulate_chunks)
        self.cfg_ref = ray.put(cfg)  # the section is a plain dataclass: Ray pickles it as it is
        from trainforge.driver import local_cluster

        self.env_ref = ray.put(local_cluster.worker_env())

    def submit(self, chunks: list[tuple[int, int]]) -> Any:
        args = (self.cfg_ref, self.seed, chunks, self.device, self.env_ref)
        if not self.members:
            return self.task.remote(*args)
        member = min(self.members, key=self.members.__getitem__)
        ref = member.simulate.remote(*args)
        self.members[member] += 1
        self.of[ref] = member
        return ref

    def returned(self, ref: Any) -> None:
        """``ref`` is done: its simulator may take another."""
        member = self.of.pop(ref, None)
        if member in self.members:
            self.members[member] -= 1

    def lost(self, ref: Any) -> bool:
        """``ref`` failed with its actor: was it a member's? It is dropped."""
        member = self.of.get(ref)
        if member is None:
            return False
        if self.members.pop(member, None) is not None:  # once, whatever of its tasks failed
            what = "a GPU's simulator process" if self.device == "cuda" else "a warm simulator"
            log.say(f"simulations: {what} ended; its chunks go to "
                    f"{'the others' if self.members else 'new Ray workers'}")  # fmt: skip
        return True


def _result(
    ray: Any, ref: Any, chunks: list[tuple[int, int]], pending: dict[Any, Any]
) -> dict[str, Any]:
    """A task's chunks; a failed task cancels the others and fails the stage (a RecipeError
    raised in the task, such as a broken user simulator, as itself)."""
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        for other in pending:
            ray.cancel(other)
        if isinstance(exc.cause, RecipeError):
            raise exc.cause from None
        raise RuntimeError(f"simulation chunk {chunks[0][0]} failed: {exc}") from None


@dataclass
class Progress:
    """The stage's console lines: done / total, pace and ETA every few seconds, where the work
    ran and what was invalid at the end."""

    total: int
    done: int
    say: Callable[[str], None]
    started: float = field(default_factory=time.monotonic)
    last: float = field(default_factory=time.monotonic)
    slots: int = 0  # tasks the cluster runs at once (0: not known)
    simulated: int = 0  # by this run (not a resumed entry's earlier chunks)
    simulator_seconds: float = 0.0  # the chunks' own (0: not known, as for GPU chunks)
    first: tuple[float, int] | None = None  # (when, simulated) at the first finished task
    workers: set[str] = field(default_factory=set)

    def add(self, simulations: int, workers: set[str], seconds: float = 0.0) -> None:
        """A task's chunks are in: ``simulations`` by ``workers`` in ``seconds`` of their own."""
        now = time.monotonic()
        self.done += simulations
        self.simulated += simulations
        self.simulator_seconds += seconds
        self.workers |= workers
        if self.first is None:
            self.first = (now, self.simulated)
        if now - self.last >= PROGRESS_EVERY_S and self.done < self.total:
            self.last = now
            rate = self.pace(now)
            pace = f", {rate:,.0f}/s" if rate > 0 else ""  # nothing to tell it from yet
            eta = f", ETA {(self.total - self.done) / rate:.0f} s" if rate > 0 else ""
            self.say(
                f"simulations: {self.done:,}/{self.total:,} ({self.done / self.total:.0%})"
                f"{pace} on {log.counted(len(self.workers), 'process', 'processes')}{eta}"
            )

    def pace(self, now: float) -> float:
        """Simulations per second now (0: not known yet). Where the chunks' own seconds are
        known: every process seen so far at the speed measured in its chunks. Counting finished
        tasks instead lags behind the work in flight — a stage's first tasks are one-chunk
        pilots, the next ones seconds long — and said 41/s, ETA 71 s, five seconds into a
        stage that was done five seconds later. Else: the finished tasks' rate since the first
        one (the workers' start is not the pace)."""
        if self.simulator_seconds > 0:
            processes = min(len(self.workers), self.slots or len(self.workers))
            return processes * self.simulated / self.simulator_seconds
        assert self.first is not None
        since, before = self.first
        return (self.simulated - before) / max(now - since, 1e-9)

    def finish(self, manifest: dict[str, Any]) -> None:
        if self.simulated:
            seconds = time.monotonic() - self.started
            nodes = {w.split(":")[0] for w in self.workers}
            self.say(
                f"simulations: {self.simulated:,} in {seconds:.1f} s "
                f"({self.simulated / max(seconds, 1e-9):,.0f}/s) by "
                f"{log.counted(len(self.workers), 'process', 'processes')} on "
                f"{log.counted(len(nodes), 'node', 'nodes')}"
            )
        if manifest["invalid"]:
            self.say(f"simulations: {invalid_summary(manifest)}")


def invalid_summary(manifest: dict[str, Any]) -> str:
    """``37 of 5,000 are invalid: 25 raised in the simulator (first: …), 12 have NaN/inf in x``"""
    invalid, failed = manifest["invalid"], manifest.get("failed", 0)
    parts = []
    if failed:
        parts.append(f"{failed:,} raised in the simulator (first: {manifest['first_failure']})")
    if invalid - failed:
        parts.append(f"{invalid - failed:,} have NaN/inf in x")
    return f"{invalid:,} of {manifest['num_simulations']:,} are invalid: " + ", ".join(parts)


def summarize(job: Plan, known: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The manifest: the spec, the counts of invalid and raised simulations (the first
    error), and per node the processes that simulated and how many simulations each node did.
    ``known``: the facts of the chunks just simulated; the others (written by an earlier,
    interrupted stage) are read back."""
    known = known or {}
    chunks = [known.get(i) or chunk_facts(_load(job.chunk_path(i))) for i, _ in job.chunks]
    failures = [c["first_failure"] for c in chunks if c["failed"]]
    ran_on: dict[str, dict[str, Any]] = {}
    for chunk in chunks:
        node, _, pid = chunk["worker"].rpartition(":")
        if pid:
            entry = ran_on.setdefault(node, {"processes": set(), "simulations": 0})
            entry["processes"].add(pid)
            entry["simulations"] += chunk["rows"]
    return {
        **job.spec,
        "key": job.key,
        "chunks": len(job.chunks),
        "invalid": sum(c["invalid"] for c in chunks),
        "failed": sum(c["failed"] for c in chunks),
        "first_failure": failures[0] if failures else "",
        "ran_on": {
            node: {"processes": len(e["processes"]), "simulations": e["simulations"]}
            for node, e in sorted(ran_on.items())
        },
        "dim_theta": chunks[0]["dim_theta"],
        "dim_x": chunks[0]["dim_x"],
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def chunk_facts(chunk: dict[str, Any]) -> dict[str, Any]:
    """What the manifest needs of a chunk, without its tensors."""
    return {
        "rows": len(chunk["x"]),
        "dim_theta": int(chunk["theta"].shape[1]),
        "dim_x": int(chunk["x"].shape[1]),
        "invalid": int(chunk["invalid"]),
        "failed": int(chunk.get("failed", 0)),
        "first_failure": str(chunk.get("first_failure", "")),
        "worker": str(chunk.get("worker", "")),
    }


def read_manifest(folder: Path) -> dict[str, Any]:
    return json.loads((folder / MANIFEST).read_text())


def check_invalid(folder: Path, drop_invalid: bool) -> None:
    """Refuse invalid simulations (NaN/inf in x, or the simulator raised) before training
    unless the recipe drops them; refuse always when none is valid."""
    manifest = read_manifest(folder)
    invalid, total = manifest["invalid"], manifest["num_simulations"]
    failed = manifest.get("failed", 0)
    raised = f" ({failed:,} raised: {manifest['first_failure']})" if failed else ""
    if invalid == total:
        raise RecipeError(
            f"workload.simulator: all {total:,} simulations have NaN or inf in x{raised}"
        )
    if invalid and not drop_invalid:
        raise RecipeError(
            f"workload.simulator: {invalid:,} of {total:,} simulations have NaN or inf in x"
            f"{raised}; set workload.simulation.drop_invalid=true to drop them"
        )


def load(folder: Path, drop_invalid: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """All simulations of a finished cache entry, in chunk order, invalid rows dropped."""
    import torch

    manifest = read_manifest(folder)
    chunks = [read_chunk(chunk_file(folder, i)) for i in range(manifest["chunks"])]
    theta = torch.cat([theta for theta, _ in chunks])
    x = torch.cat([x for _, x in chunks])
    valid = torch.isfinite(x).all(dim=1)
    if not bool(valid.all()):
        if not drop_invalid:
            check_invalid(folder, drop_invalid)
        theta, x = theta[valid], x[valid]
    return theta, x


def read_chunk(path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """One chunk's (θ, x)."""
    chunk = _load(path)
    return chunk["theta"], chunk["x"]


def _load(path: Path) -> dict[str, Any]:
    import torch

    return torch.load(path, map_location="cpu", weights_only=True)


def save_chunk(result: dict[str, Any], path: Path) -> None:
    import torch

    chunk = {k: result[k] for k in ("theta", "x", "invalid", "failed", "first_failure")}
    chunk["worker"] = result.get("worker", "")
    with replacing(path) as temporary:
        torch.save(chunk, temporary)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with replacing(path) as temporary:
        temporary.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
