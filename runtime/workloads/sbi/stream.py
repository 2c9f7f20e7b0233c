"""Simulations read from disk while training, for simulation sets larger than host memory.

- **Split.** sbi's rule over the same rows as in memory (``split.split_order``): the same seeded
  permutation of the valid rows, mapped to (chunk, row) from the chunk sizes, so a recipe
  trains and validates on the same simulations whether it streams or not.
- **z-scoring.** One pass over the training rows gives the exact mean and variance (merged
  chunk by chunk in float64). sbi's builders compute z-score statistics from the batch they are
  given; they get a two-row stand-in whose statistics are exactly those, so the network's
  z-score layers hold the whole training set's numbers, as in memory.
- **Validation** rows are gathered in the same pass and kept in memory when they fit (one
  tenth of the data); otherwise they are read from disk too at each evaluation.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from trainforge.data.chunked import ChunkedData
from trainforge.workloads.sbi import chunking, simulations
from trainforge.workloads.sbi.split import split_order


@dataclass
class StreamPlan:
    files: list[Path]
    train_rows: list[Tensor]  # per chunk file, its rows in the training split
    val_rows: list[Tensor]

    @property
    def num_train(self) -> int:
        return sum(len(r) for r in self.train_rows)

    @property
    def num_val(self) -> int:
        return sum(len(r) for r in self.val_rows)


def plan(folder: Path, val_fraction: float, seed: int, drop_invalid: bool) -> StreamPlan:
    manifest = simulations.read_manifest(folder)
    files = [simulations.chunk_file(folder, i) for i in range(manifest["chunks"])]
    total = manifest["num_simulations"]
    sizes = chunking.chunk_sizes(total, manifest["chunk_size"])
    if manifest["invalid"]:
        simulations.check_invalid(folder, drop_invalid)  # refuses unless dropped
        valid = torch.cat([torch.isfinite(simulations.read_chunk(f)[1]).all(dim=1) for f in files])
        valid_rows = valid.nonzero().squeeze(1)
    else:
        valid_rows = torch.arange(total)
    train_order, val_order = split_order(len(valid_rows), val_fraction, seed)
    train = valid_rows[train_order].sort().values
    val = valid_rows[val_order].sort().values
    return StreamPlan(files, _per_chunk(train, sizes), _per_chunk(val, sizes))


def _per_chunk(rows: Tensor, sizes: list[int]) -> list[Tensor]:
    """Sorted global row numbers → per chunk, the row numbers within that chunk."""
    starts = torch.tensor([0, *sizes]).cumsum(0)
    chunk = torch.searchsorted(starts[1:], rows, right=True)
    counts = torch.bincount(chunk, minlength=len(sizes)).tolist()
    return list(torch.split(rows - starts[chunk], counts))


@dataclass
class Moments:
    """Exact mean and variance per dimension (Chan et al.'s pairwise merge, float64), and the
    mean of each row's standard deviation across dimensions (sbi's "structured" z-score)."""

    count: int = 0
    mean: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    m2: Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.float64))
    row_std_sum: float = 0.0

    def add(self, batch: Tensor) -> None:
        if len(batch) == 0:
            return
        values = batch.double()
        n, mean = len(values), values.mean(dim=0)
        m2 = ((values - mean) ** 2).sum(dim=0)
        if self.count == 0:
            self.mean, self.m2 = mean, m2
        else:
            total = self.count + n
            delta = mean - self.mean
            self.mean = self.mean + delta * n / total
            self.m2 = self.m2 + m2 + delta**2 * self.count * n / total
        self.count += n
        if values.shape[1] > 1:
            self.row_std_sum += float(values.std(dim=1).clamp_min(1e-14).sum())

    def stand_in(self, structured: bool) -> Tensor:
        """Two rows from which sbi's z-scoring computes exactly these statistics."""
        dim = len(self.mean)
        if structured and dim > 1:
            # every element's mean, and a per-row std equal to the mean of the rows' stds
            pattern = torch.arange(dim, dtype=torch.float64)
            pattern = (pattern - pattern.mean()) / pattern.std()
            row = self.mean.mean() + self.row_std_sum / self.count * pattern
            return torch.stack([row, row]).float()
        # two rows μ ± σ/√2 have mean μ and (unbiased) standard deviation σ in every dimension
        std = (self.m2 / max(self.count - 1, 1)).sqrt()
        return torch.stack([self.mean + std / math.sqrt(2), self.mean - std / math.sqrt(2)]).float()


@dataclass
class Scan:
    """What one pass over the chunks yields: z-score stand-ins and, if asked, the validation
    rows in memory."""

    theta_stand_in: Tensor
    x_stand_in: Tensor
    val: tuple[Tensor, Tensor] | None


def scan(job: StreamPlan, structured_theta: bool, structured_x: bool, keep_val: bool) -> Scan:
    theta_moments, x_moments = Moments(), Moments()
    val_theta: list[Tensor] = []
    val_x: list[Tensor] = []
    for path, train, val in zip(job.files, job.train_rows, job.val_rows, strict=True):
        theta, x = simulations.read_chunk(path)
        theta_moments.add(theta[train])
        x_moments.add(x[train])
        if keep_val:
            val_theta.append(theta[val])
            val_x.append(x[val])
    return Scan(
        theta_moments.stand_in(structured_theta),
        x_moments.stand_in(structured_x),
        (torch.cat(val_theta), torch.cat(val_x)) if keep_val else None,
    )


def chunked(job: StreamPlan, rows: list[Tensor], window_rows: int) -> ChunkedData:
    return ChunkedData(job.files, rows, simulations.read_chunk, window_rows)
