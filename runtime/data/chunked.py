"""Splits read from disk one window of chunks at a time, for data larger than host memory.

A ``ChunkedData`` split is a list of chunk files and, per file, which of its rows belong to the
split. Each epoch the chunk order is shuffled (seeded by run seed and epoch); rank r reads
chunks r, r + world, … of that order and then wraps around to the start, so every rank makes
the same number of steps (as DistributedSampler pads). Chunks are grouped into windows of at
least ``window_rows`` rows. While one window trains, the next is read on a background thread;
the main thread moves it to the device in one copy (no CUDA call from the reader thread, which
could break a CUDA-graph capture), shuffles it there and cuts it into batches. A window's last
partial batch is dropped, so a window's batches do not depend on the one before, and a mid-epoch
resume skips whole windows without reading them.

For simulations, which are i.i.d. draws, shuffling within windows of randomly ordered chunks
loses nothing against a global shuffle.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from trainforge.distributed import WorkerContext

# data.types.Batch, which this module cannot import (data.types imports ChunkedData from here)
Batch = tuple[torch.Tensor, ...]


@dataclass
class ChunkedData:
    """A split kept on disk: ``read(file)`` gives a chunk's tensors on the host (e.g. θ and x),
    of which rows ``rows[i]`` of ``files[i]`` belong to this split."""

    files: list[Path]
    rows: list[torch.Tensor]
    read: Callable[[Path], Batch]
    window_rows: int

    def __len__(self) -> int:
        return sum(len(r) for r in self.rows)

    def read_rows(self, indices: list[int]) -> Batch:
        """This split's rows of the given chunks, each tensor concatenated, on the host."""
        parts = [self._rows_of(i) for i in indices]
        return tuple(torch.cat(same) for same in zip(*parts, strict=True))

    def _rows_of(self, index: int) -> Batch:
        return tuple(t[self.rows[index]] for t in self.read(self.files[index]))


@dataclass
class Window:
    number: int
    chunks: list[int]
    take: int  # batches this window contributes to the epoch
    skip: int  # of those, already trained before a resume


def epoch_windows(
    split: ChunkedData, ctx: WorkerContext, batch_size: int, seed: int, epoch: int,
    num_batches: int, skip_batches: int = 0,
) -> Iterator[Window]:  # fmt: skip
    """The windows this rank reads in an epoch of ``num_batches`` batches (skipped ones left
    out), from chunk sizes alone."""
    if len(split) == 0:
        return
    order = torch.randperm(len(split.files), generator=_generator(seed, epoch)).tolist()
    stream = itertools.chain(order[ctx.rank :: ctx.world_size], itertools.cycle(order))
    min_rows = max(split.window_rows, batch_size)
    done, number, chunks, rows = 0, 0, [], 0
    for index in stream:
        if done >= num_batches:
            return
        if len(split.rows[index]) == 0:
            continue
        chunks.append(index)
        rows += len(split.rows[index])
        if rows < min_rows:
            continue
        take = min(rows // batch_size, num_batches - done)
        if done + take > skip_batches:
            yield Window(number, chunks, take, max(0, skip_batches - done))
        done += take
        number, chunks, rows = number + 1, [], 0


def train_batches(
    split: ChunkedData, ctx: WorkerContext, batch_size: int, seed: int, epoch: int,
    num_batches: int, skip_batches: int = 0,
) -> Iterator[Batch]:  # fmt: skip
    """This rank's training batches of one epoch, on ``ctx.device``."""
    windows = epoch_windows(split, ctx, batch_size, seed, epoch, num_batches, skip_batches)
    reader = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainforge-chunks")
    try:
        window = next(windows, None)
        pending = reader.submit(split.read_rows, window.chunks) if window else None
        while window is not None and pending is not None:
            host = pending.result()
            current, window = window, next(windows, None)
            pending = reader.submit(split.read_rows, window.chunks) if window else None
            tensors = tuple(t.to(ctx.device) for t in host)
            order = torch.randperm(
                len(tensors[0]), generator=_generator(seed, epoch, ctx.rank, current.number)
            ).to(ctx.device)
            for b in range(current.skip, current.take):
                idx = order[b * batch_size : (b + 1) * batch_size]
                yield tuple(t[idx] for t in tensors)
    finally:
        reader.shutdown(wait=True, cancel_futures=True)


def eval_batches(split: ChunkedData, ctx: WorkerContext, batch_size: int) -> Iterator[Batch]:
    """Every row of the split exactly once over all ranks: whole chunks per rank when there are
    at least as many chunks as ranks, otherwise every rank reads them all and takes every
    world-th row (so no rank is left without batches, which the metric all-reduce needs)."""
    with_rows = [i for i, rows in enumerate(split.rows) if len(rows)]
    by_chunk = len(with_rows) >= ctx.world_size
    mine = with_rows[ctx.rank :: ctx.world_size] if by_chunk else with_rows
    for index in mine:
        tensors = split.read_rows([index])
        if not by_chunk:
            mine_only = slice(ctx.rank, None, ctx.world_size)
            tensors = tuple(t[mine_only] for t in tensors)
        tensors = tuple(t.to(ctx.device) for t in tensors)
        for start in range(0, len(tensors[0]), batch_size):
            yield tuple(t[start : start + batch_size] for t in tensors)


def _generator(*seeds: int) -> torch.Generator:
    state = np.random.SeedSequence(list(seeds)).generate_state(1, dtype=np.uint64)[0]
    return torch.Generator().manual_seed(int(state >> 1))
