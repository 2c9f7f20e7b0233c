"""The pieces of the training loop that need no process group: sharding and batching,
LR schedule, mixed precision, checkpoint files and RNG state, MLflow helpers."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from trainforge import checkpoint, config, optim
from trainforge.data import sharding
from trainforge.data.types import TensorData
from trainforge.distributed import WorkerContext
from trainforge.precision import Precision
from trainforge.tracking import client as tracking_client

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "recipes" / "cnn" / "digits_simple_cnn.yaml"
CPU = torch.device("cpu")


def ctx(rank: int = 0, world_size: int = 1) -> WorkerContext:
    return WorkerContext(rank=rank, local_rank=rank, world_size=world_size, node_rank=0, device=CPU)


def tensor_data(n: int) -> TensorData:
    # inputs carry their own index so batches can be traced back to samples
    inputs = torch.arange(n, dtype=torch.float32).view(n, 1).repeat(1, 3)
    return TensorData(inputs, torch.arange(n))


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
    for inputs, targets in batches.epoch(epoch, skip_batches=skip):
        assert inputs.shape == (batches.batch_size, 3)
        assert torch.equal(inputs[:, 0].long(), targets)  # inputs and targets stay paired
        out.append(targets.tolist())
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
        for inputs, targets in sharding.eval_batches(split, ctx(rank, world_size), batch_size=4):
            assert len(targets) <= 4
            assert torch.equal(inputs[:, 0].long(), targets)
            seen += targets.tolist()
    assert sorted(seen) == list(range(n))


def test_eval_batches_split_smaller_than_world() -> None:
    split = tensor_data(1)
    seen = []
    for rank in range(3):
        for _, targets in sharding.eval_batches(split, ctx(rank, 3), batch_size=4):
            seen += targets.tolist()
    assert seen == [0]


def test_eval_batches_map_style_dataset() -> None:
    split = torch.utils.data.TensorDataset(torch.arange(9).float().view(9, 1), torch.arange(9))
    seen = []
    for rank in (0, 1):
        for _, targets in sharding.eval_batches(split, ctx(rank, 2), batch_size=2):
            seen += targets.tolist()
    assert sorted(seen) == list(range(9))


# --- optim.lr_factor -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def optimizer_imports() -> None:
    """torch imports torch._dynamo lazily (~1 s) when the first optimizer is built: pay it once
    here, in setup, rather than inside whichever test happens to build one first."""
    torch.optim.SGD(nn.Linear(1, 1).parameters(), lr=0.1)


def train_section(*overrides: str):
    return config.load(DIGITS, list(overrides)).train


def test_warmup_rises_linearly_to_one() -> None:
    train = train_section("train.schedule=cosine", "train.warmup_steps=4")
    factors = [optim.lr_factor(step, 100, train) for step in range(4)]
    assert factors == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert optim.lr_factor(4, 100, train) == pytest.approx(1.0)  # decay starts from the peak


@pytest.mark.parametrize("min_lr_ratio", [0.0, 0.1])
def test_cosine_ends_at_min_lr_ratio(min_lr_ratio: float) -> None:
    train = train_section(
        "train.schedule=cosine", "train.warmup_steps=10", f"train.min_lr_ratio={min_lr_ratio}"
    )
    total = 110
    factors = [optim.lr_factor(step, total, train) for step in range(10, total + 1)]
    assert factors[0] == pytest.approx(1.0)
    assert factors[-1] == pytest.approx(min_lr_ratio)
    assert all(a >= b for a, b in itertools.pairwise(factors))
    assert optim.lr_factor(60, total, train) == pytest.approx((1 + min_lr_ratio) / 2)
    assert optim.lr_factor(total + 50, total, train) == pytest.approx(min_lr_ratio)


def test_linear_is_halfway_at_mid() -> None:
    train = train_section("train.schedule=linear", "train.min_lr_ratio=0.2")
    assert optim.lr_factor(0, 100, train) == pytest.approx(1.0)
    assert optim.lr_factor(50, 100, train) == pytest.approx(0.6)
    assert optim.lr_factor(25, 100, train) == pytest.approx(0.8)
    assert optim.lr_factor(100, 100, train) == pytest.approx(0.2)


def test_constant_stays_one() -> None:
    train = train_section("train.schedule=constant")
    assert {optim.lr_factor(step, 50, train) for step in range(60)} == {1.0}


@pytest.mark.usefixtures("optimizer_imports")
def test_schedule_drives_the_optimizer() -> None:
    train = train_section("train.schedule=linear", "train.lr=0.1", "train.optimizer=sgd")
    model = nn.Linear(2, 1)
    optimizer = optim.build_optimizer(model, train)
    scheduler = optim.build_schedule(optimizer, train, total_steps=10)
    lrs = []
    for _ in range(10):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs == pytest.approx([0.1 * (1 - s / 10) for s in range(10)])


# --- precision -----------------------------------------------------------------------------


@pytest.mark.usefixtures("optimizer_imports")
def test_fp16_scaler_state_survives_a_checkpoint(tmp_path: Path) -> None:
    precision = Precision("fp16", CPU)
    assert precision.scaler.is_enabled()
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        loss = model(torch.randn(8, 4)).pow(2).mean()
        precision.backward(loss)
        norm = precision.step(optimizer, list(model.parameters()), 1.0, measure_norm=True)
        assert norm is not None and torch.isfinite(norm)
        optimizer.zero_grad()
    precision.scaler.update(new_scale=1024.0)  # a scale no fresh scaler has
    state = precision.state_dict()
    assert state["scale"] == 1024.0
    assert state["_growth_tracker"] == 3

    checkpoint.save(tmp_path, {"scaler": state}, "recipe: x\n")
    loaded = checkpoint.load(tmp_path)
    assert (tmp_path / checkpoint.RECIPE_FILE).read_text() == "recipe: x\n"
    fresh = Precision("fp16", CPU)
    assert fresh.state_dict() != state
    fresh.load_state_dict(loaded["scaler"])
    assert fresh.state_dict() == state
    assert fresh.scaler.get_scale() == 1024.0


def test_bf16_autocast_on_cpu() -> None:
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with Precision("bf16", CPU).autocast():
        assert (a @ b).dtype == torch.bfloat16
    assert (a @ b).dtype == torch.float32
    assert not Precision("bf16", CPU).scaler.is_enabled()


def test_fp32_autocast_is_a_no_op() -> None:
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    with Precision("fp32", CPU).autocast():
        assert not torch.is_autocast_enabled("cpu")
        assert torch.equal(a @ b, torch.matmul(a, b))
        assert (a @ b).dtype == torch.float32
    precision = Precision("fp32", CPU)
    assert not precision.scaler.is_enabled()
    precision.load_state_dict(precision.state_dict())  # empty state: nothing to load


# --- checkpoint RNG state ------------------------------------------------------------------


def draws() -> tuple[list[float], list[float], list[float]]:
    return (
        [random.random() for _ in range(5)],
        np.random.rand(5).tolist(),
        torch.rand(5).tolist(),
    )


def test_rng_state_round_trip(tmp_path: Path) -> None:
    # keep the global RNG streams as they were for the tests that follow
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        random.seed(11)
        np.random.seed(12)
        torch.manual_seed(13)
        np.random.randn()  # leave a cached gaussian in numpy's state
        state = checkpoint.capture_rng(CPU)
        first = draws()

        checkpoint.save(tmp_path, {"rng": [state]}, "")
        loaded = checkpoint.load(tmp_path)["rng"]
        random.seed(0)
        np.random.seed(0)
        torch.manual_seed(0)
        assert checkpoint.restore_rng(loaded, ctx(0, 1)) is True
        assert draws() == first

        # the wrong number of states (world size changed) leaves the streams alone
        before = draws()
        assert checkpoint.restore_rng(loaded * 2, ctx(0, 1)) is False
        assert checkpoint.restore_rng([], ctx(0, 1)) is False
        assert draws() != before  # continued, not rewound
        assert checkpoint.restore_rng(loaded, ctx(0, 1)) is True
        assert draws() == first
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])


def test_rng_state_picks_this_ranks_entry() -> None:
    saved = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    try:
        states = []
        for seed in (1, 2):
            random.seed(seed)
            np.random.seed(seed)
            torch.manual_seed(seed)
            states.append(checkpoint.capture_rng(CPU))
        expected = draws()  # seed 2 streams
        assert checkpoint.restore_rng(states, ctx(1, 2)) is True
        assert draws() == expected
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        torch.set_rng_state(saved[2])


# --- tracking helpers ----------------------------------------------------------------------


def test_flatten() -> None:
    flat = tracking_client.flatten(
        {"train": {"lr": 0.1, "clip": None}, "run": {"name": "x"}, "long": "y" * 7000, "n": 3}
    )
    assert flat == {
        "train.lr": "0.1",
        "train.clip": "None",
        "run.name": "x",
        "long": "y" * 6000,
        "n": "3",
    }


def test_flatten_a_real_recipe() -> None:
    flat = tracking_client.flatten(config.to_container(config.load(DIGITS)))
    assert flat["train.lr"] == "0.002"
    assert flat["workload.model"] == "simple_cnn"
    assert flat["run.name"] == "digits-simple-cnn"
    assert all(isinstance(v, str) and len(v) <= 6000 for v in flat.values())


def test_resolve_uri_default_is_absolute_sqlite_in_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    uri = tracking_client.resolve_uri(None)
    assert uri == "sqlite:///" + str((tmp_path / "mlflow.db").resolve())
    assert Path(uri[len("sqlite:///") :]).is_absolute()


def test_resolve_uri_relative_sqlite_becomes_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert tracking_client.resolve_uri("sqlite:///sub/t.db") == "sqlite:///" + str(
        (tmp_path / "sub" / "t.db").resolve()
    )
    absolute = "sqlite:////" + str(tmp_path).lstrip("/") + "/x.db"
    assert tracking_client.resolve_uri(absolute) == absolute
    assert tracking_client.resolve_uri("http://mlflow:5000") == "http://mlflow:5000"


def test_resolve_uri_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking:5000")
    assert tracking_client.resolve_uri(None) == "http://tracking:5000"
    assert tracking_client.resolve_uri("file:///tmp/mlruns") == "file:///tmp/mlruns"  # recipe wins


@pytest.mark.parametrize("loader_workers", [0, 2])
def test_dataloader_path_yields_the_tensor_paths_batches(loader_workers: int) -> None:
    """A map-style Dataset goes through a DataLoader with the runtime's sampler (worker
    processes, persistent across epochs); it must see exactly the batches the tensor path sees,
    also when an epoch resumes part-way."""
    from torch.utils.data import TensorDataset

    split = tensor_data(61)
    as_dataset = TensorDataset(split.inputs, split.targets)
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
