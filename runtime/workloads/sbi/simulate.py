"""The simulation stage: N (θ, x) pairs, simulated once and kept in a hash-addressed cache.

The N simulations are cut into chunks with one seed each, so the result does not depend on how
many machines ran them. Every chunk is a Ray task — one CPU each for ordinary simulators, one
GPU each for vectorised torch simulators when the cluster has GPUs — and the driver writes each
finished chunk to ``<cache>/<key>/chunk-NNNNNN.pt`` (write to a temporary name, then rename, so
a file that exists is complete). ``manifest.json`` is written last: its presence means the
entry is whole. Interrupted, the stage resumes by simulating only the missing chunks.

The key hashes what determines the data: the task (or the user's prior and simulator, with a
digest of their source code), N, the chunk size, the seed and the simulating device (CPU and
CUDA generators give different streams).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainforge import log, storage
from trainforge.atomic import replacing
from trainforge.errors import RecipeError
from trainforge.workloads.sbi import sources

FORMAT = 1  # bump when the chunk layout changes, so old entries are not misread
MANIFEST = "manifest.json"


@dataclass
class Plan:
    folder: Path
    key: str
    spec: dict[str, Any]
    chunks: list[tuple[int, int]]  # (index, size)
    device: str

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


def simulation_device(cfg: Any, source: sources.SimulationSource, cluster_gpus: float) -> str:
    choice = cfg.simulation.device
    if choice not in ("auto", "cpu", "cuda"):
        raise RecipeError(f"workload.simulation.device: {choice!r} is not one of auto, cpu, cuda")
    if choice == "cuda" and (cluster_gpus < 1 or not source.vectorized):
        why = "the Ray cluster has no GPU" if cluster_gpus < 1 else "the simulator is not torch"
        raise RecipeError(f"workload.simulation.device: cuda, but {why}")
    if choice == "auto":
        return "cuda" if source.vectorized and cluster_gpus >= 1 else "cpu"
    return choice


def plan(cfg: Any, source: sources.SimulationSource, seed: int, root: Path, device: str) -> Plan:
    sim = cfg.simulation
    spec = {
        "format": FORMAT,
        "source": source.fingerprint,
        "num_simulations": sim.num_simulations,
        "chunk_size": sim.chunk_size,
        "seed": seed,
        "device": device,
    }
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]
    name = source.name.replace(":", "-").replace("/", "-").replace(".", "-")
    folder = root / f"{name}-{key}"
    sizes = chunk_sizes(sim.num_simulations, sim.chunk_size)
    return Plan(folder, key, spec, list(enumerate(sizes)), device)


def chunk_file(folder: Path, index: int) -> Path:
    return folder / f"chunk-{index:06d}.pt"


def chunk_sizes(num_simulations: int, chunk_size: int) -> list[int]:
    """Simulations per chunk: ``chunk_size`` each, the last one what is left."""
    return [min(chunk_size, num_simulations - s) for s in range(0, num_simulations, chunk_size)]


def chunk_seed(seed: int, index: int) -> int:
    return int(np.random.SeedSequence([seed, index]).generate_state(1, dtype=np.uint64)[0] >> 1)


def simulate_chunk(cfg: Any, seed: int, index: int, size: int, device: str) -> dict[str, Any]:
    """One chunk, in a Ray task: θ from the prior, x from the simulator, NaN/inf counted."""
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    source = sources.resolve(cfg)
    s = chunk_seed(seed, index)
    torch.manual_seed(s)  # user priors/simulators draw from the global RNGs
    np.random.seed(s % 2**32)
    generator = torch.Generator(device=device).manual_seed(s)
    started = time.perf_counter()
    with torch.no_grad():
        theta = source.sample_prior(size, generator)
        x = source.simulate(theta if source.vectorized else theta.cpu(), generator)
    invalid = int((~torch.isfinite(x).all(dim=1)).sum())
    return {
        "theta": theta.float().cpu().contiguous(),
        "x": x.float().cpu().contiguous(),
        "invalid": invalid,
        "seconds": time.perf_counter() - started,
    }


def run(cfg: Any, seed: int, storage_root: str, quiet: bool = False) -> Path:
    """Make sure the recipe's simulations exist; return their folder. Needs a connected Ray."""
    import ray

    source = sources.resolve(cfg)
    device = simulation_device(cfg, source, ray.cluster_resources().get("GPU", 0))
    job = plan(cfg, source, seed, cache_root(cfg, storage_root), device)
    say = (lambda _: None) if quiet else log.say
    if (job.folder / MANIFEST).is_file():
        say(f"simulations: reusing {job.folder}")
        return job.folder
    job.folder.mkdir(parents=True, exist_ok=True)
    _write_json(job.folder / "spec.json", job.spec)
    todo = job.missing()
    total = cfg.simulation.num_simulations
    done_sims = total - sum(n for _, n in todo)
    say(
        f"simulations: {len(todo)} of {len(job.chunks)} chunks to simulate for {total:,} "
        f"{source.name} simulations on {device} → {job.folder}"
        + (f" (resuming: {done_sims:,} done)" if done_sims else "")
    )
    resources = {"num_gpus": 1} if device == "cuda" else {"num_cpus": cfg.simulation.cpus_per_chunk}
    remote = ray.remote(**resources)(simulate_chunk)
    # The section is a plain dataclass: Ray pickles it as it is.
    pending = {remote.remote(cfg, seed, i, n, device): i for i, n in todo}
    started, last_print = time.monotonic(), 0.0
    while pending:
        ready, _ = ray.wait(list(pending), num_returns=1)
        index = pending.pop(ready[0])
        try:
            result = ray.get(ready[0])
        except ray.exceptions.RayTaskError as exc:
            for ref in pending:
                ray.cancel(ref)
            cause = exc.cause if isinstance(exc.cause, RecipeError) else None
            if cause is not None:
                raise cause from None
            raise RuntimeError(f"simulation chunk {index} failed: {exc}") from None
        _save_atomic(result, job.chunk_path(index))
        done_sims += len(result["x"])
        now = time.monotonic()
        if now - last_print > 5 or not pending:
            last_print = now
            rate = (done_sims - (total - sum(n for _, n in todo))) / max(now - started, 1e-9)
            left = (total - done_sims) / rate if rate > 0 else 0
            say(
                f"simulations: {done_sims:,}/{total:,} ({done_sims / total:.0%}), "
                f"{rate:,.0f}/s, ETA {left:.0f} s"
            )
    manifest = summarize(job)
    _write_json(job.folder / MANIFEST, manifest)
    if manifest["invalid"]:
        say(f"simulations: {manifest['invalid']:,} of {total:,} have NaN/inf in x")
    return job.folder


def summarize(job: Plan) -> dict[str, Any]:
    chunks = [_load(job.chunk_path(i)) for i, _ in job.chunks]
    first = chunks[0]
    return {
        **job.spec,
        "key": job.key,
        "chunks": len(job.chunks),
        "invalid": sum(int(c["invalid"]) for c in chunks),
        "dim_theta": int(first["theta"].shape[1]),
        "dim_x": int(first["x"].shape[1]),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


def read_manifest(folder: Path) -> dict[str, Any]:
    return json.loads((folder / MANIFEST).read_text())


def check_invalid(folder: Path, drop_invalid: bool) -> None:
    """Refuse NaN/inf simulations before training unless the recipe drops them."""
    manifest = read_manifest(folder)
    invalid = manifest["invalid"]
    if invalid and not drop_invalid:
        raise RecipeError(
            f"workload.simulator: {invalid:,} of {manifest['num_simulations']:,} simulations "
            "have NaN or inf in x; set workload.simulation.drop_invalid=true to drop them"
        )


def load(folder: Path, drop_invalid: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """All simulations of a finished cache entry, in chunk order, invalid rows dropped."""
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
    return torch.load(path, map_location="cpu", weights_only=True)


def _save_atomic(result: dict[str, Any], path: Path) -> None:
    chunk = {"theta": result["theta"], "x": result["x"], "invalid": result["invalid"]}
    with replacing(path) as temporary:
        torch.save(chunk, temporary)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    with replacing(path) as temporary:
        temporary.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
