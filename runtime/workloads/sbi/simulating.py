"""Simulating chunks, in whatever process runs the stage's tasks (``simulate.py`` plans them):
θ from the prior (or the chunk's rows of the recipe's proposal file) and x from the simulator,
each chunk from its own seed, so that the result does not depend on which process made it;
NaN/inf and raised rows counted."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:  # torch and the sources' module (torch) only where simulations are made
    import torch

    from trainforge.workloads.sbi import sources


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
    simulator calls slowed a per-sample simulator by ~1%. The values are each chunk's alone:
    before its simulator, the global RNGs are where its own seed and prior draw left them."""
    import torch

    # as many threads as the task holds CPUs (one by default), whatever the environment says:
    # more would compete with the other tasks on the machine
    threads = (
        cfg.simulation.cpus_per_chunk if device == "cpu" else os.environ.get("OMP_NUM_THREADS")
    )
    torch.set_num_threads(max(1, int(float(threads or 1))))
    source = _source(cfg)
    draw = _Draws(source, seed, device, _proposal(cfg, source.vectorized))
    with torch.no_grad():
        if device == "cpu":
            drawn = [draw(index, size) for index, size in chunks]
            made = [_simulate(source, chunk) for chunk in drawn]
        else:
            # a GPU chunk is large (one vectorised call): nothing to gain, and its CUDA RNG is
            # seeded with the CPU's by torch.manual_seed, which the next chunk's draw resets
            made = [_simulate(source, draw(i, n)) for i, n in chunks]
    return [_checked(*chunk) for chunk in made]


@dataclass
class _Drawn:
    """A chunk's θ and the RNG states its simulator continues from."""

    seed: int
    theta: torch.Tensor
    generator: torch.Generator  # a built-in task's: its prior and simulator draw from it
    cpu_rng: torch.Tensor  # the global CPU generator's state after the prior's draw
    seconds: float


@dataclass
class _Proposal:
    """The θ of a proposal file (``workload.simulation.proposal``): chunk ``index`` simulates
    rows ``index * rows`` onwards."""

    theta: torch.Tensor
    rows: int


_proposals: dict[str, torch.Tensor] = {}  # read once per process: a worker runs many tasks


def _proposal(cfg: Any, vectorized: bool) -> _Proposal | None:
    from trainforge.workloads.sbi import chunking

    path = cfg.simulation.proposal
    if path is None:
        return None
    if path not in _proposals:
        _proposals[path] = read_proposal(path)
    sim = cfg.simulation
    return _Proposal(_proposals[path], chunking.chunk_rows(sim.num_simulations, sim.chunk_size,
                                                           vectorized))  # fmt: skip


def read_proposal(path: str) -> torch.Tensor:
    """The θ of a proposal file: float32, one row per simulation."""
    import torch

    theta = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(theta, torch.Tensor) or theta.dim() != 2:
        raise ValueError(f"{path} holds no [num_simulations, dim_theta] tensor of θ")
    return theta.float()


@dataclass
class _Draws:
    """Each chunk's θ: from the prior, by the chunk's own seed, or its rows of the proposal;
    the simulator then continues from the chunk's seed either way."""

    source: sources.SimulationSource
    seed: int
    device: str
    proposal: _Proposal | None

    def __call__(self, index: int, size: int) -> _Drawn:
        import torch

        s = chunk_seed(self.seed, index)
        # user priors/simulators draw from the global RNGs. On the CPU only its generator:
        # torch.manual_seed also queues a seed for CUDA's lazy start, formatting the call
        # stack each time, and cost a per-sample simulator's 16-row chunks ~2%
        if self.device == "cpu":
            torch.default_generator.manual_seed(s)
        else:
            torch.manual_seed(s)
        generator = torch.Generator(device=self.device).manual_seed(s)
        started = time.perf_counter()
        if self.proposal is None:
            theta = self.source.sample_prior(size, generator)
        else:
            start = index * self.proposal.rows
            theta = self.proposal.theta[start : start + size].to(self.device)
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
    chunks: list[tuple[int, int]], cfg: Any, seed: int, device: str
) -> dict[str, Any]:
    """One task of the stage (``workloads/stage.py``'s ``Tasks.function``): a few chunks. Their
    θ and x go back as one tensor each (``unpack`` cuts them apart): pickling a tensor costs
    ~0.1 ms, and two per 16-row chunk of a per-sample simulator were ~0.5% of its work, paid
    while the task's core waits."""
    return pack(simulate_chunk_list(cfg, seed, chunks, device))


def pack(results: list[dict[str, Any]]) -> dict[str, Any]:
    """``simulate_chunk``'s results as one θ, one x and the rest of each chunk's result."""
    import torch

    return {
        "theta": torch.cat([r["theta"] for r in results]),
        "x": torch.cat([r["x"] for r in results]),
        "rows": [len(r["x"]) for r in results],
        "chunks": [{k: v for k, v in r.items() if k not in ("theta", "x")} for r in results],
    }


def unpack(task: dict[str, Any], worker: str) -> list[dict[str, Any]]:
    """A task's result as ``simulate_chunk``'s, one per chunk, each with its own θ and x (copies:
    ``torch.save`` of a slice would write the whole task's tensor into every chunk file), and
    where it ran."""
    thetas, xs = task["theta"].split(task["rows"]), task["x"].split(task["rows"])
    return [
        chunk | {"theta": theta.clone(), "x": x.clone(), "worker": worker}
        for chunk, theta, x in zip(task["chunks"], thetas, xs, strict=True)
    ]
