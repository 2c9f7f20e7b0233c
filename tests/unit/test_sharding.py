"""Sharding and batching (``trainforge.data.sharding``): the runtime's DistributedSampler,
training micro-batches (tensor and DataLoader paths, resumable mid-epoch), validation batches."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from trainforge.data import sharding
from trainforge.data.types import TensorData
from trainforge.distributed import WorkerContext

CPU = torch.device("cpu")


def ctx(rank: int = 0, world_size: int = 1) -> WorkerContext:
    return WorkerContext(rank=rank, local_rank=rank, world_size=world_size, node_rank=0, device=CPU)


def tensor_data(n: int) -> TensorData:
    # features carry their sample's index so batches can be traced back to samples
    features = torch.arange(n, dtype=torch.float32).view(n, 1).repeat(1, 3)
    return TensorData(features, torch.arange(n))


# --- ShardSampler --------------------------------------------------------------------------


def shards(n: int, epoch: int = 0, seed: int = 0, world_size: int = 2) -> list[list[int]]:
    out = []
    for rank in range(world_size):
        sampler = sharding.ShardSampler(n, ctx(rank, world_size), seed=seed)
        sampler.set_position(epoch)
        out.append(list(sampler))
    return out


@pytest.mark.parametrize("n", [10, 64])
def test_even_shards_are_disjoint_and_cover(n: int) -> None:
    first, second = shards(n)
    assert len(first) == len(second) == n // 2
    assert not set(first) & set(second)
    assert sorted(first + second) == list(range(n))


@pytest.mark.parametrize("n", [11, 63])
def test_odd_shards_cover_with_one_padded_duplicate(n: int) -> None:
    first, second = shards(n)
    assert len(first) == len(second) == (n + 1) // 2
    assert set(first) | set(second) == set(range(n))
    counts = Counter(first + second)
    assert sum(counts.values()) == n + 1
    assert [c for c in counts.values() if c > 1] == [2]


def test_order_changes_between_epochs_and_repeats_within_one() -> None:
    n = 50
    epoch0, epoch0_again, epoch1 = shards(n, 0), shards(n, 0), shards(n, 1)
    assert epoch0 == epoch0_again
    assert epoch0 != epoch1
    assert sorted(epoch0[0] + epoch0[1]) == sorted(epoch1[0] + epoch1[1]) == list(range(n))
    # the seed matters too
    assert shards(n, 0, seed=1) != epoch0


@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("skip", [0, 1, 7, 25])
def test_skip_drops_the_first_samples(rank: int, skip: int) -> None:
    n = 50
    sampler = sharding.ShardSampler(n, ctx(rank, 2), seed=3)
    sampler.set_position(4)
    full = list(sampler)
    assert len(sampler) == len(full) == 25
    sampler.set_position(4, skip=skip)
    assert list(sampler) == full[skip:]
    assert len(sampler) == 25 - skip
    sampler.set_position(4)  # skip applies to the one epoch it was set for
    assert list(sampler) == full


# --- TrainBatches and micro_batches_per_epoch ----------------------------------------------


def test_tensor_batches_follow_the_sampler_with_the_next_epoch_computed_ahead() -> None:
    split, batch_size = tensor_data(50), 4
    batches = sharding.TrainBatches(split, ctx(1, 2), batch_size, seed=9)
    sampler = sharding.ShardSampler(50, ctx(1, 2), seed=9)

    def expected(epoch: int, skip: int = 0) -> list[list[int]]:
        sampler.set_position(epoch, skip * batch_size)
        order = list(sampler)
        return [order[i : i + batch_size] for i in range(0, len(order) - batch_size + 1, 4)]

    for epoch in (0, 1, 2):  # in sequence: each epoch's order was computed during the last
        assert epoch_indices(batches, epoch) == expected(epoch)
        assert batches.next_order is not None and batches.next_order[0] == epoch + 1
    assert epoch_indices(batches, 6, skip=2) == expected(6, skip=2)  # a jump, as on resume
    assert epoch_indices(batches, 7) == expected(7)


def epoch_indices(batches: sharding.TrainBatches, epoch: int, skip: int = 0) -> list[list[int]]:
    out = []
    for features, ids in batches.epoch(epoch, skip_batches=skip):
        assert features.shape == (batches.batch_size, 3)
        assert torch.equal(features[:, 0].long(), ids)  # a batch's tensors stay paired
        out.append(ids.tolist())
    return out


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("batch_size", [4, 7])
@pytest.mark.parametrize("n", [57, 64])
def test_micro_batches_per_epoch_matches_iteration(
    world_size: int, batch_size: int, n: int
) -> None:
    split = tensor_data(n)
    expected = sharding.micro_batches_per_epoch(n, ctx(0, world_size), batch_size)
    seen: list[int] = []
    for rank in range(world_size):
        batches = sharding.TrainBatches(split, ctx(rank, world_size), batch_size, seed=0)
        for epoch in (0, 1):
            got = epoch_indices(batches, epoch)
            assert len(got) == expected
            assert all(len(b) == batch_size for b in got)
            if epoch == 0:
                seen += [i for b in got for i in b]
    # every full batch of every rank together: no sample is used more than the padding allows
    per_rank = -(-n // world_size)
    assert len(seen) == world_size * expected * batch_size
    assert expected == per_rank // batch_size
    assert max(Counter(seen).values()) <= 2


@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("skip", [0, 1, 3])
def test_skip_batches_resumes_mid_epoch(world_size: int, skip: int) -> None:
    split = tensor_data(61)
    for rank in range(world_size):
        batches = sharding.TrainBatches(split, ctx(rank, world_size), batch_size=5, seed=2)
        full = epoch_indices(batches, 3)
        assert epoch_indices(batches, 3, skip=skip) == full[skip:]


def test_ranks_get_different_batches() -> None:
    split = tensor_data(40)
    a = epoch_indices(sharding.TrainBatches(split, ctx(0, 2), 4, seed=0), 0)
    b = epoch_indices(sharding.TrainBatches(split, ctx(1, 2), 4, seed=0), 0)
    assert not {i for x in a for i in x} & {i for x in b for i in x}


# --- eval_batches --------------------------------------------------------------------------


@pytest.mark.parametrize("n", [2, 10, 33])
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_eval_batches_cover_every_sample_once(n: int, world_size: int) -> None:
    split = tensor_data(n)
    seen = []
    for rank in range(world_size):
        for features, ids in sharding.eval_batches(split, ctx(rank, world_size), batch_size=4):
            assert len(ids) <= 4
            assert torch.equal(features[:, 0].long(), ids)
            seen += ids.tolist()
    assert sorted(seen) == list(range(n))


def test_eval_batches_split_smaller_than_world() -> None:
    split = tensor_data(1)
    seen = []
    for rank in range(3):
        for _, ids in sharding.eval_batches(split, ctx(rank, 3), batch_size=4):
            seen += ids.tolist()
    assert seen == [0]


def test_eval_batches_map_style_dataset() -> None:
    split = torch.utils.data.TensorDataset(torch.arange(9).float().view(9, 1), torch.arange(9))
    seen = []
    for rank in (0, 1):
        for _, ids in sharding.eval_batches(split, ctx(rank, 2), batch_size=2):
            seen += ids.tolist()
    assert sorted(seen) == list(range(9))


@pytest.mark.parametrize("loader_workers", [0, 2])
def test_dataloader_path_yields_the_tensor_paths_batches(loader_workers: int) -> None:
    """A map-style Dataset goes through a DataLoader with the runtime's sampler (worker
    processes, persistent across epochs); it must see exactly the batches the tensor path sees,
    also when an epoch resumes part-way."""
    from torch.utils.data import TensorDataset

    split = tensor_data(61)
    as_dataset = TensorDataset(*split.tensors)
    for rank in (0, 1):
        tensors = sharding.TrainBatches(split, ctx(rank, 2), batch_size=5, seed=2)
        loader = sharding.TrainBatches(
            as_dataset, ctx(rank, 2), batch_size=5, seed=2, loader_workers=loader_workers
        )
        assert loader.loader is not None and tensors.loader is None
        assert loader.loader.persistent_workers == (loader_workers > 0)
        for epoch in (0, 1):
            assert epoch_indices(loader, epoch) == epoch_indices(tensors, epoch)
        assert epoch_indices(loader, 2, skip=3) == epoch_indices(tensors, 2, skip=3)


@pytest.mark.parametrize("count", [1, 3])
def test_a_batch_is_every_tensor_of_the_split_unnamed(count: int) -> None:
    """The data layer names no tensor: batches carry all of a split's tensors, in its order,
    through the tensor, DataLoader and validation paths alike."""
    from torch.utils.data import TensorDataset

    ids = torch.arange(30)
    tensors = [ids * (k + 1) for k in range(count)]
    split = TensorData(*tensors)
    loader = sharding.TrainBatches(TensorDataset(*tensors), ctx(0, 2), batch_size=4, seed=1)
    paths = {
        "tensors": sharding.TrainBatches(split, ctx(0, 2), batch_size=4, seed=1).epoch(0),
        "loader": loader.epoch(0),
        "eval": sharding.eval_batches(split, ctx(0, 2), batch_size=4),
    }
    for batches in paths.values():
        for batch in batches:
            assert isinstance(batch, tuple) and len(batch) == count
            for k, tensor in enumerate(batch):
                assert torch.equal(tensor, batch[0] * (k + 1))


@pytest.mark.parametrize(("length", "world"), [(1003, 4), (10, 3), (7, 4), (2, 4), (50, 1)])
def test_the_tensor_shard_is_the_samplers_shard(length: int, world: int) -> None:
    """The tensor path builds its epoch order with tensor ops (a Python list of 10^7 indices
    costs a second per epoch); it must be DistributedSampler's order exactly."""
    for rank in range(world):
        ctx = WorkerContext(rank, rank, world, 0, torch.device("cpu"))
        sampler = sharding.ShardSampler(length, ctx, seed=3)
        sampler.set_position(epoch=2)
        expected = torch.tensor(list(sampler), dtype=torch.long)
        assert torch.equal(sharding.shard_order(length, ctx, seed=3, epoch=2), expected)
