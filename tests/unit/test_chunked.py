"""Chunked splits read from disk window by window (trainforge.chunked): equal steps on every
rank, only the split's rows, exact mid-epoch resume, and validation rows seen exactly once."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import torch

from trainforge.data import sharding
from trainforge.data.chunked import ChunkedData, epoch_windows, eval_batches, train_batches
from trainforge.distributed import WorkerContext

CPU = torch.device("cpu")


def ctx(rank: int = 0, world_size: int = 1) -> WorkerContext:
    return WorkerContext(rank=rank, local_rank=rank, world_size=world_size, node_rank=0, device=CPU)


class Chunks:
    """Chunk files on disk whose rows carry their global number, and a count of reads."""

    def __init__(self, folder: Path, sizes: list[int]) -> None:
        self.files, self.reads = [], Counter()
        start = 0
        for i, size in enumerate(sizes):
            ids = torch.arange(start, start + size)
            path = folder / f"chunk-{i}.pt"
            torch.save({"features": ids.float().view(-1, 1).repeat(1, 2), "ids": ids}, path)
            self.files.append(path)
            start += size

    def read(self, path: Path) -> tuple[torch.Tensor, torch.Tensor]:
        self.reads[path] += 1
        chunk = torch.load(path, weights_only=True)
        return chunk["features"], chunk["ids"]

    def split(self, keep_every: int, window_rows: int) -> ChunkedData:
        """Every keep_every-th row of each chunk belongs to the split (others: another split)."""
        rows = []
        for path in self.files:
            n = len(torch.load(path, weights_only=True)["ids"])
            rows.append(torch.arange(0, n, keep_every))
        return ChunkedData(self.files, rows, self.read, window_rows)


def epoch_rows(split: ChunkedData, world: int, batch: int, epoch: int = 0, skip: int = 0):
    num = sharding.micro_batches_per_epoch(len(split), ctx(0, world), batch)
    out = []
    for rank in range(world):
        batches = list(train_batches(split, ctx(rank, world), batch, 7, epoch, num, skip))
        for features, ids in batches:
            assert features.shape == (batch, 2) and torch.equal(features[:, 0].long(), ids)
        out.append([b[1].tolist() for b in batches])
    return num, out


def test_every_rank_makes_the_same_steps_from_the_split_rows_only(tmp_path: Path) -> None:
    chunks = Chunks(tmp_path, [100] * 9 + [37])  # 10 chunks for 3 ranks, the last one short
    split = chunks.split(keep_every=2, window_rows=120)  # odd row numbers are not in it
    num, ranks = epoch_rows(split, world=3, batch=16)
    assert num == -(-len(split) // 3) // 16
    assert [len(r) for r in ranks] == [num] * 3  # DDP needs equal step counts
    seen = [row for rank in ranks for batch in rank for row in batch]
    assert all(row % 2 == 0 for row in seen)
    # unused in an epoch: each window's last partial batch, and the chunks of a rank with one
    # more than it needs — different ones each epoch, so a few epochs see every row
    assert len(set(seen)) >= 0.75 * len(split)
    for epoch in range(1, 6):
        _, more = epoch_rows(split, world=3, batch=16, epoch=epoch)
        seen += [row for rank in more for batch in rank for row in batch]
    assert set(seen) == {row for row in range(937) if row % 2 == 0}


def test_epochs_are_shuffled_differently_and_reproducibly(tmp_path: Path) -> None:
    split = Chunks(tmp_path, [50] * 8).split(keep_every=1, window_rows=100)
    _, first = epoch_rows(split, world=2, batch=10, epoch=0)
    _, again = epoch_rows(split, world=2, batch=10, epoch=0)
    _, second = epoch_rows(split, world=2, batch=10, epoch=1)
    assert first == again
    assert first != second


@pytest.mark.parametrize("skip", [1, 7, 12])
def test_a_resumed_epoch_continues_exactly_and_skips_whole_windows_unread(
    tmp_path: Path, skip: int
) -> None:
    chunks = Chunks(tmp_path, [40] * 10)
    split = chunks.split(keep_every=1, window_rows=80)  # 2 chunks, 8 batches of 10 per window
    _, full = epoch_rows(split, world=1, batch=10)
    chunks.reads.clear()
    _, resumed = epoch_rows(split, world=1, batch=10, skip=skip)
    assert resumed[0] == full[0][skip:]
    windows = list(epoch_windows(split, ctx(), 10, 7, 0, len(full[0]), skip))
    assert sum(chunks.reads.values()) == sum(len(w.chunks) for w in windows)
    assert len(windows) == 5 - skip // 8  # windows wholly before the resume point are not read


@pytest.mark.parametrize("world", [2, 3, 5])
def test_validation_sees_every_row_once_over_the_ranks(tmp_path: Path, world: int) -> None:
    chunks = Chunks(tmp_path, [30, 30, 30, 11])  # fewer chunks than 5 ranks: rows are strided
    split = chunks.split(keep_every=3, window_rows=1)
    seen = []
    for rank in range(world):
        batches = list(eval_batches(split, ctx(rank, world), batch_size=8))
        assert batches, "every rank takes part in the metric all-reduce"
        seen += [row for _, ids in batches for row in ids.tolist()]
    expected = [row for i, rows in enumerate(split.rows) for row in (rows + 30 * i).tolist()]
    assert sorted(seen) == sorted(expected)


def test_the_loop_batches_a_chunked_split_through_train_batches(tmp_path: Path) -> None:
    split = Chunks(tmp_path, [64] * 4).split(keep_every=1, window_rows=64)
    loop = sharding.TrainBatches(split, ctx(0, 2), batch_size=16, seed=7)
    batches = list(loop.epoch(0))
    assert len(batches) == sharding.micro_batches_per_epoch(len(split), ctx(0, 2), 16) == 8
    assert len(list(sharding.eval_batches(split, ctx(1, 2), batch_size=50))) == 4  # 2 chunks × 2


def test_batches_carry_every_tensor_a_chunk_has(tmp_path: Path) -> None:
    """The data layer names no tensor: a chunk of three tensors gives batches of three."""
    chunks = Chunks(tmp_path, [40] * 4)

    def read(path: Path) -> tuple[torch.Tensor, ...]:
        features, ids = chunks.read(path)
        return features, ids, -ids

    split = ChunkedData(chunks.files, [torch.arange(40)] * 4, read, window_rows=80)
    assert [len(t) for t in split.read_rows([0, 2])] == [80, 80, 80]
    num = sharding.micro_batches_per_epoch(len(split), ctx(0, 2), 10)
    batches = [
        *train_batches(split, ctx(1, 2), 10, 7, 0, num),
        *eval_batches(split, ctx(1, 2), batch_size=10),
    ]
    assert len(batches) == num + 8
    for features, ids, negated in batches:
        assert torch.equal(features[:, 0].long(), ids) and torch.equal(negated, -ids)
