"""The simulation stage: N (θ, x) pairs, simulated once and kept in a hash-addressed cache.

The N simulations are cut into chunks with one seed each, so the result does not depend on how
many machines ran them (``chunking.py``: chunk sizes depend on N and the recipe only). The
driver's stage runner (``driver/stage.py``) spreads them over the cluster — tasks of a few
chunks each, holding one CPU (``cpus_per_chunk``) for ordinary simulators or one GPU for
vectorised torch simulators when the cluster has GPUs, sized from the cluster's slots and the
simulator's measured cost so that every core stays busy to the end (``chunking.TaskSizer``) —
or, for a built-in task that one core makes in seconds, runs it in a process of the command's
own (``make_here``). Each finished chunk is written to ``<cache>/<key>/chunk-NNNNNN.pt``
(``simulations.py``: a file that exists is complete); the manifest is written last: its
presence means the entry is whole. Interrupted, the stage resumes by simulating only the
missing chunks; one command at a time makes an entry.

A simulation is invalid when its x holds NaN or inf, or when a per-sample simulator raised on
its parameters (``sources.Failures``: x is stored as NaN); the manifest counts both, and the
recipe drops them or stops (``drop_invalid``). Each chunk also records the node and process
that simulated it, so the manifest says where the work ran.

The key hashes what determines the data: the task (or the user's prior and simulator, with a
digest of their source code), N, the chunk size, the seed and the simulating device (CPU and
CUDA generators give different streams).
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainforge import log, storage
from trainforge.errors import RecipeError
from trainforge.workloads.sbi import catalogue, chunking
from trainforge.workloads.sbi.progress import PROGRESS_EVERY_S, Progress
from trainforge.workloads.sbi.simulating import simulate_chunk, simulate_chunks, unpack
from trainforge.workloads.sbi.simulations import (
    MANIFEST,
    chunk_facts,
    chunk_file,
    invalid_summary,
    read_manifest,
    save_chunk,
    summarize,
    write_json,
)
from trainforge.workloads.stage import StageRunner, Tasks

if TYPE_CHECKING:  # the sources' module (torch) only where a user's simulator is probed
    from trainforge.workloads.sbi import sources

FORMAT = 1  # bump when the chunk layout changes, so old entries are not misread
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

    def rows_on_disk(self) -> int:
        return sum(n for i, n in self.chunks if self.chunk_path(i).is_file())


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
    if sim.proposal is not None:  # its θ, not the prior's
        spec["proposal"] = hashlib.sha256(Path(sim.proposal).read_bytes()).hexdigest()
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]
    name = source.name.replace(":", "-").replace("/", "-").replace(".", "-")
    folder = root / f"{name}-{key}"
    sizes = chunking.chunk_sizes(sim.num_simulations, rows)
    return Plan(folder, key, spec, list(enumerate(sizes)), device)


HERE_MAX_SECONDS = 8.0
"""A built-in task's stage is made in the command's own process when one CPU core takes at most
this long: the cluster's new worker processes take about as long to start."""


def simulates_here(cfg: Any) -> bool:
    """Is the stage made by the command itself (``workload.simulation.where``)?"""
    where = cfg.simulation.where
    if where != "auto":
        return bool(where == "here")
    if cfg.task == catalogue.CUSTOM or cfg.simulation.device == "cuda":
        return False  # a user's simulator's cost is unknown until it runs
    per_million = catalogue.TASK_SHAPES[cfg.task].cpu_seconds_per_million
    return cfg.simulation.num_simulations / 1e6 * per_million <= HERE_MAX_SECONDS


_rows_before: dict[str, int] = {}  # a stage made here: its simulations on disk when it started


def start_early(cfg: Any, seed: int, storage_root: str, runner: StageRunner) -> None:
    """Start a built-in task's stage before the cluster is reached, where it needs none
    (``simulates_here``) and the cache does not hold it yet; ``run`` then waits for it."""
    if cfg.simulation.path is not None or cfg.task == catalogue.CUSTOM or not simulates_here(cfg):
        return  # a user's simulator made here (where: here) starts in ``run``, with its code_dir
    job = plan(cfg, facts(cfg), seed, cache_root(cfg, storage_root), "cpu")
    if not (job.folder / MANIFEST).is_file():
        begin(job)
        _start_here(cfg, seed, job, runner)


def run(cfg: Any, seed: int, storage_root: str, runner: StageRunner, quiet: bool = False) -> Path:
    """Make sure the recipe's simulations exist; return their folder. On the cluster
    ``runner`` runs on, unless the stage is made here (``simulates_here``)."""
    source = facts(cfg)
    check_proposal(cfg, source)
    here = simulates_here(cfg)
    cluster = {} if here else runner.resources()
    device = "cpu" if here else simulation_device(cfg, source, cluster.get("GPU", 0))
    job = plan(cfg, source, seed, cache_root(cfg, storage_root), device)
    say = (lambda _: None) if quiet else log.say
    started_early = runner.started_in_command(str(job.folder)) is not None
    if (job.folder / MANIFEST).is_file() and not (here and started_early):
        say(f"simulations: reusing {job.folder}")
        return job.folder
    begin(job)
    if here:
        _make_here(cfg, seed, job, source.name, runner, say)
        return job.folder
    on_disk = lambda: f"{len(job.chunks) - len(job.missing())}/{len(job.chunks)} chunks on disk"  # noqa: E731
    with runner.one_maker(job.folder, "simulations", say, on_disk):
        if (job.folder / MANIFEST).is_file():  # another command made them meanwhile
            say(f"simulations: reusing {job.folder}")
            return job.folder
        _make_on_cluster(cfg, seed, job, source.name, runner, say)
    return job.folder


def check_proposal(cfg: Any, source: catalogue.SourceFacts | sources.SimulationSource) -> None:
    """A proposal file holds one θ of the task's dimension per simulation."""
    path = cfg.simulation.proposal
    if path is None:
        return
    from trainforge.workloads.sbi.simulating import read_proposal

    try:
        theta = read_proposal(path)
    except (OSError, ValueError, RuntimeError) as exc:
        raise RecipeError(f"workload.simulation.proposal: {log.first_line(exc)}") from exc
    want = (cfg.simulation.num_simulations, source.dim_theta)
    if tuple(theta.shape) != want:
        raise RecipeError(
            f"workload.simulation.proposal: {path} holds θ of shape {list(theta.shape)}; "
            f"num_simulations and {source.name}'s θ want {list(want)}"
        )


def _make_on_cluster(cfg: Any, seed: int, job: Plan, name: str, runner: StageRunner,
                     say: Callable[[str], None]) -> None:  # fmt: skip
    """The chunks not on disk, spread over the cluster's CPUs (or GPUs), each written as it
    arrives by a few writer threads (each file is flushed to disk, milliseconds apiece: one
    thread could not keep up with many cores); the manifest last."""
    todo = job.missing()
    total = cfg.simulation.num_simulations
    progress = Progress(total, total - sum(n for _, n in todo), say)
    done: dict[int, dict[str, Any]] = {}
    sizer = chunking.TaskSizer(1, job.rows_per_chunk)

    def placed(slots: int, where: str) -> Callable[[int], int]:
        progress.slots = sizer.slots = slots
        say(f"simulations: {len(todo)} of {len(job.chunks)} chunks of {job.rows_per_chunk:,} "
            f"to simulate for {total:,} {name} simulations on {where} → {job.folder}"
            + (f" (resuming: {progress.done:,} done)" if progress.done else ""))  # fmt: skip
        return sizer.next_size

    with ThreadPoolExecutor(WRITERS, thread_name_prefix="chunk-writer") as writers:
        writes = []

        def finished(chunks: list[tuple[int, int]], task: dict[str, Any], worker: str) -> None:
            results = unpack(task, worker)
            for (index, _), result in zip(chunks, results, strict=True):
                writes.append(writers.submit(save_chunk, result, job.chunk_path(index)))
                done[index] = chunk_facts(result)
            simulated = sum(len(r["x"]) for r in results)
            seconds = sum(r["seconds"] for r in results)
            sizer.record(simulated, seconds)
            # a GPU chunk's seconds are its launches' (the copy to the CPU waits for the work)
            progress.add(simulated, {worker}, seconds if job.device == "cpu" else 0.0)

        runner.run(Tasks(simulate_chunks, (cfg, seed, job.device), todo, job.device,
                         cfg.simulation.cpus_per_chunk, placed, finished,
                         label="simulations", noun="chunks"))  # fmt: skip
        for write in writes:
            write.result()  # a write that failed fails the stage
    progress.finish(finish(job, done))


def _start_here(cfg: Any, seed: int, job: Plan, runner: StageRunner) -> bool:
    rows = job.rows_on_disk()
    started = runner.start_in_command(str(job.folder), make_here, (cfg, seed, job))
    if started:
        _rows_before[str(job.folder)] = rows
    return started


def _make_here(cfg: Any, seed: int, job: Plan, name: str, runner: StageRunner,
               say: Callable[[str], None]) -> None:  # fmt: skip
    """The stage in a process of the command's own on this machine (``make_here``): started by
    ``start_early`` while Ray started, or now."""
    total = cfg.simulation.num_simulations
    early = not _start_here(cfg, seed, job, runner)
    key = str(job.folder)
    resumed = _rows_before.pop(key)  # the early process's rows are not a resumed entry's
    say(f"simulations: {total - resumed:,} {name} simulations "
        f"on this machine's CPU{' (begun before the workers started)' if early else ''}"
        f" → {job.folder}" + (f" (resuming: {resumed:,} done)" if resumed else ""))  # fmt: skip
    began = runner.started_in_command(key) or time.time()

    def on_disk() -> None:
        rows = job.rows_on_disk()
        say(f"simulations: {rows:,}/{total:,} ({rows / total:.0%})")

    runner.wait_in_command(key, on_disk, PROGRESS_EVERY_S)
    seconds = max(0.0, (job.folder / MANIFEST).stat().st_mtime - began)
    say(f"simulations: {total - resumed:,} in {seconds:.1f} s by this command's own process "
        "(one CPU core)")  # fmt: skip
    manifest = read_manifest(job.folder)
    if manifest["invalid"]:
        say(f"simulations: {invalid_summary(manifest)}")


def make_here(cfg: Any, seed: int, job: Plan) -> None:
    """The stage in the command's own process (``workloads/stage.py``): the missing chunks, as
    the cluster's tasks on the CPU would make them, then the manifest."""
    worker = f"{socket.gethostname()}:{os.getpid()}"
    done = {}
    for index, size in job.missing():
        result = simulate_chunk(cfg, seed, index, size, "cpu") | {"worker": worker}
        save_chunk(result, job.chunk_path(index))
        done[index] = chunk_facts(result)
    finish(job, done)


def begin(job: Plan) -> None:
    """The entry's folder, with the spec its key hashes (for whoever looks at the cache)."""
    job.folder.mkdir(parents=True, exist_ok=True)
    write_json(job.folder / "spec.json", job.spec)


def finish(job: Plan, done: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Write the manifest, last: the entry is whole. ``done``: the chunks just simulated."""
    paths = [job.chunk_path(index) for index, _ in job.chunks]
    manifest = summarize(job.spec, job.key, paths, done)
    write_json(job.folder / MANIFEST, manifest)
    return manifest


def facts(cfg: Any) -> catalogue.SourceFacts | sources.SimulationSource:
    """The recipe's source as the stage plans it: a built-in task's from the catalogue (no
    torch in the driver); a user's prior and simulator imported and probed."""
    if cfg.task != catalogue.CUSTOM:
        return catalogue.builtin(cfg.task)
    from trainforge.workloads.sbi import sources

    return sources.resolve(cfg)
