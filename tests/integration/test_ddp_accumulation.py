"""DDP as the loop builds it, for real (2 processes, gloo): only the last micro-step of an
accumulation window all-reduces and the ranks end with identical parameters; BatchNorm's
running statistics are not broadcast before every forward, and evaluation reads rank 0's."""

from __future__ import annotations

import copy
import os
import socket
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
from torch.nn.parallel import DistributedDataParallel

from trainforge.distributed import WorkerContext
from trainforge.precision import Precision
from trainforge.worker.step import optimizer_step
from trainforge.workloads.cnn.config import CNNWorkloadConfig
from trainforge.workloads.cnn.workload import CNNWorkload


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def two_ranks(rank_body: Callable[..., dict], *args: object) -> dict[int, dict]:
    """``rank_body(rank, *args)`` on two spawned processes in one gloo process group; what each
    returned, by rank. The results come back as files rather than through a multiprocessing
    Manager: a Manager forks this process, and when an earlier test of this xdist worker had
    connected it to the shared Ray, the fork shared Ray's gRPC connections with the child (Ray
    warns against forking for this): the next test's first Ray call then waited forever (CI,
    twice: ``ray.cluster_resources()`` in test_disk_full, 900 s)."""
    with tempfile.TemporaryDirectory() as folder:
        mp.spawn(_rank_main, args=(rank_body, _free_port(), folder, args), nprocs=2, join=True)
        return {rank: torch.load(f"{folder}/{rank}.pt", weights_only=True) for rank in (0, 1)}


def _rank_main(rank: int, body: Callable[..., dict], port: int, folder: str, args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        result = body(rank, *args)
    finally:
        dist.destroy_process_group()
    torch.save(result, f"{folder}/{rank}.pt")


def _accumulating_rank(rank: int) -> dict:
    from trainforge.workloads.cnn.models import SimpleCNN

    torch.manual_seed(0)
    model = DistributedDataParallel(SimpleCNN(1, 10, 32))
    calls = {"n": 0}

    def counting_hook(state, bucket):  # counts every bucket all-reduce DDP launches
        calls["n"] += 1
        return allreduce_hook(state, bucket)

    model.register_comm_hook(dist.group.WORLD, counting_hook)
    workload = CNNWorkload(CNNWorkloadConfig(), seed=0)  # no augmentation or smoothing
    precision = Precision("fp32", torch.device("cpu"))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(rank)

    def batch():
        return torch.randn(4, 1, 32, 32, generator=gen), torch.randint(0, 10, (4,), generator=gen)

    counts = []
    for window_size in (1, 3, 4):
        before = calls["n"]
        window = [batch() for _ in range(window_size)]
        optimizer_step(model, window, workload, precision, optimizer, clip_grad_norm=1.0)
        counts.append(calls["n"] - before)
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(2)]
    dist.all_gather(gathered, flat)
    return {"counts": counts, "same": torch.equal(gathered[0], gathered[1])}


def test_only_the_last_micro_step_all_reduces() -> None:
    results = two_ranks(_accumulating_rank)
    for rank in (0, 1):
        counts = results[rank]["counts"]
        # A window of 3 or 4 micro-steps launches exactly the all-reduces of one backward pass.
        assert counts[0] > 0
        assert counts == [counts[0]] * 3, counts
        assert results[rank]["same"], "ranks diverged"


def test_world_size_one_has_no_ddp_wrapper() -> None:
    from trainforge.distributed import sync_context, wrap
    from trainforge.workloads.cnn.models import SimpleCNN

    ctx = WorkerContext(rank=0, local_rank=0, world_size=1, node_rank=0, device=torch.device("cpu"))
    model = SimpleCNN(1, 10, 32)
    assert wrap(model, ctx) is model
    with sync_context(model, sync=False):  # must not need .no_sync()
        pass


def _averager_rank(rank: int) -> dict:
    """The same model trained twice on this rank's own batches: averaged by DDP, and by the
    graphed steps' own hooks (``gradient_averaging``) in buckets small enough to be several."""
    import pickle

    from torch import nn

    from trainforge import distributed
    from trainforge.gradient_averaging import AveragedModule

    torch.manual_seed(rank)  # different initial weights: both make them rank 0's
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10)
    )
    model.register_parameter("unused", nn.Parameter(torch.ones(3)))  # gets no gradient
    ours = copy.deepcopy(model)
    ddp = DistributedDataParallel(model, find_unused_parameters=True)
    averaged = AveragedModule(ours, bucket_mb=20 / 2**20)  # ~20 bytes a bucket
    workload = CNNWorkload(CNNWorkloadConfig(), seed=0)
    precision = Precision("fp32", torch.device("cpu"))
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (ddp, ours)]
    gen = torch.Generator().manual_seed(100 + rank)
    start = torch.cat([p.detach().flatten() for p in ours.parameters()])
    for i in range(3):
        batch = (torch.randn(4, 1, 8, 8, generator=gen), torch.randint(0, 10, (4,)))
        for trained, optimizer in zip((ddp, averaged), optimizers, strict=True):
            optimizer_step(trained, [batch], workload, precision, optimizer, None)
        if i == 0:  # a forward without a backward (evaluation) between two steps
            with torch.no_grad():
                averaged(batch[0])
        if i == 1:  # a backward that raises half-way, as a failed capture may
            cut_short_backward(averaged, ours[2], batch[0])
    flat = torch.cat([p.detach().flatten() for p in ours.parameters()])
    everyone = [torch.zeros_like(flat) for _ in range(2)]
    dist.all_gather(everyone, flat)
    return {
        "buckets": len(averaged.averager.buckets),
        # what is checkpointed and logged: no hook of the averaging travels with it
        "unwrapped": distributed.unwrap(averaged) is ours,
        "picklable": len(pickle.dumps(copy.deepcopy(distributed.unwrap(averaged)))) > 0,
        "like_ddp": all(
            torch.allclose(a, b, atol=1e-6)
            for a, b in zip(model.parameters(), ours.parameters(), strict=True)
        ),
        "moved": not torch.equal(flat, start),
        "ranks_equal": torch.equal(everyone[0], everyone[1]),
        "unused": ours.unused.detach().clone(),
    }


def cut_short_backward(model: torch.nn.Module, cut: torch.nn.Module, images: torch.Tensor) -> None:
    """A backward pass of ``model`` that raises at the gradient of ``cut``'s output: the layers
    after it have their gradients, the layers before it do not."""

    def raising(grad: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("cut short")

    def on_output(module: torch.nn.Module, inputs: object, output: torch.Tensor) -> None:
        output.register_hook(raising)

    handle = cut.register_forward_hook(on_output)
    try:
        model(images).sum().backward()
    except RuntimeError as exc:
        assert "cut short" in str(exc)
    else:
        raise AssertionError("the backward pass was not cut short")
    finally:
        handle.remove()
    model.zero_grad(set_to_none=True)


def test_the_graphed_steps_own_gradient_averaging_trains_as_ddp() -> None:
    """``gradient_averaging.AveragedModule`` (graphed steps on several GPUs run it instead of
    DDP), for real on 2 processes: each rank's weights after three SGD steps on its own batches
    are DDP's, the ranks' weights are equal, neither a forward without a backward nor a
    backward cut short in between changes that, a parameter that gets no gradient is not
    moved, and the unwrapped model copies and pickles as model logging does."""
    from trainforge.distributed import BUCKET_CAP_MB
    from trainforge.gradient_averaging import BUCKET_MB

    assert BUCKET_MB < BUCKET_CAP_MB  # a graphed step's backward is short: smaller buckets
    results = two_ranks(_averager_rank)
    for rank in (0, 1):
        assert results[rank]["buckets"] > 2
        assert results[rank]["unwrapped"] and results[rank]["picklable"]
        assert results[rank]["like_ddp"], rank
        assert results[rank]["ranks_equal"] and results[rank]["moved"], rank
        assert torch.equal(results[rank]["unused"], torch.ones(3))


def _averaged_loop_rank(rank: int, folder: str) -> dict:
    """The whole worker loop of the digits recipe with the graphed steps' ``AveragedModule`` in
    DDP's place, as ``distributed.wrap`` makes it for CUDA graphs on several GPUs (here no capture:
    the loop's eager steps, evaluation and checkpoints around the wrapper)."""
    from trainforge import config, distributed
    from trainforge.checkpoint import FolderReporter, newest_in
    from trainforge.gradient_averaging import AveragedModule
    from trainforge.worker import trainer
    from trainforge.worker.payload import WorkerPayload

    made: list[AveragedModule] = []

    def averaged(model: torch.nn.Module, ctx: WorkerContext, *args: object) -> AveragedModule:
        made.append(AveragedModule(model))
        return made[-1]

    distributed.wrap = averaged  # the spawned process's own module: nothing else sees it
    digits = Path(__file__).resolve().parents[2] / "recipes" / "cnn" / "digits_simple_cnn.yaml"
    cfg = config.load(digits, ["tracking.enabled=false", "train.epochs=2"])
    reporter = FolderReporter(Path(folder) / f"checkpoints-{rank}")
    payload = WorkerPayload(config.to_container(cfg), f"{folder}/run-{rank}", "test")
    trainer.run(payload, WorkerContext(rank, rank, 2, 0, torch.device("cpu")), reporter)
    model = distributed.unwrap(made[0])
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.zeros_like(flat) for _ in range(2)]
    dist.all_gather(everyone, flat)
    saved = newest_in(Path(folder) / f"checkpoints-{rank}").state  # rank 0's: it saves
    return {
        "wrapped": len(made),
        # the checkpoint holds the model's own state dict, not the wrapper's ("module.…")
        "checkpointed": saved is None or saved["model"].keys() == model.state_dict().keys(),
        "saved": saved is not None,
        "ranks_equal": torch.equal(everyone[0], everyone[1]),
        "accuracy": reporter.reports[-1]["val/accuracy"],
        "checkpoints": len(reporter.reports),
    }


def test_the_loop_runs_with_the_graphed_steps_averaging_in_ddps_place(tmp_path: Path) -> None:
    results = two_ranks(_averaged_loop_rank, str(tmp_path))
    for rank in (0, 1):
        outcome = results[rank]
        assert outcome["wrapped"] == 1 and outcome["ranks_equal"], outcome
        assert outcome["checkpointed"], outcome
        assert outcome["checkpoints"] == 2 and outcome["accuracy"] > 0.5, outcome
    assert results[0]["saved"]


def _buffers_rank(rank: int) -> dict:
    from torch import nn

    from trainforge import distributed
    from trainforge.config.schema import TrainSection
    from trainforge.data.types import TensorData
    from trainforge.worker.trainer import evaluate

    ctx = WorkerContext(rank, rank, 2, 0, torch.device("cpu"))
    torch.manual_seed(rank)  # different initial buffers: wrap makes them rank 0's
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10)
    )
    model[1].running_mean.normal_()
    train_model = distributed.wrap(model, ctx)
    assert train_model.bucket_bytes_cap == distributed.BUCKET_CAP_MB * 2**20  # eager
    started_equal = gather_buffers(model)
    workload = CNNWorkload(CNNWorkloadConfig(), seed=0)
    precision = Precision("fp32", ctx.device)
    optimizer = torch.optim.SGD(train_model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank its own batches
    # a plain copy that sees this rank's batches with the trained weights: its running
    # statistics are this rank's own moving averages, which DDP's default broadcast of rank
    # 0's buffers before every forward would overwrite
    shadow = copy.deepcopy(model)
    for _ in range(3):
        images = torch.randn(8, 1, 8, 8, generator=gen)
        with torch.no_grad():
            shadow.load_state_dict(dict(model.named_parameters()), strict=False)
            shadow(images)
        batch = (images, torch.randint(0, 10, (8,), generator=gen))
        optimizer_step(train_model, [batch], workload, precision, optimizer, None)
    own = all(torch.equal(a, b) for a, b in zip(model.buffers(), shadow.buffers(), strict=True))
    trained = gather_buffers(model)
    params = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.zeros_like(params) for _ in range(2)]
    dist.all_gather(everyone, params)
    val = TensorData(torch.randn(10, 1, 8, 8, generator=gen), torch.randint(0, 10, (10,)))
    train_cfg = TrainSection(batch_size=4)
    metrics, _ = evaluate(model, val, workload, precision, ctx, train_cfg)
    return {
        "started_equal": torch.equal(started_equal[0], started_equal[1]),
        "trained": [t.clone() for t in trained],
        "evaluated": [t.clone() for t in gather_buffers(model)],
        "params_equal": torch.equal(everyone[0], everyone[1]),
        "own_statistics": own,
        "metrics": metrics,
    }


def gather_buffers(model: torch.nn.Module) -> list[torch.Tensor]:
    """Every rank's floating-point buffers, flattened, in rank order."""
    flat = torch.cat([b.flatten() for b in model.buffers() if b.is_floating_point()])
    everyone = [torch.zeros_like(flat) for _ in range(2)]
    dist.all_gather(everyone, flat)
    return everyone


def test_running_statistics_are_rank_zeros_where_they_are_read() -> None:
    results = two_ranks(_buffers_rank)
    zero, one = results[0], results[1]
    assert zero["started_equal"] and one["started_equal"]  # wrap gave rank 1 rank 0's buffers
    assert zero["params_equal"] and one["params_equal"]  # the weights train as one
    # no broadcast before each forward: each rank's statistics followed its own batches
    assert zero["own_statistics"] and one["own_statistics"]
    assert not torch.equal(zero["trained"][0], zero["trained"][1])
    # evaluation reads rank 0's statistics on every rank
    for rank in (zero, one):
        assert torch.equal(rank["evaluated"][0], zero["trained"][0])
        assert torch.equal(rank["evaluated"][1], zero["trained"][0])
    assert zero["metrics"] == one["metrics"]
