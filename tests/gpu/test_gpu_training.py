"""GPU tier: run on the lent GPU machine (``pytest -m gpu tests/gpu``); skipped without CUDA.

Mixed precision over NCCL through Ray Train on 2 GPUs, the CIFAR-10 ResNet-18 recipe on
synthetic data on every GPU, a torchvision model by name, and data resident on the GPU.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from trainforge import checkpoint, config
from trainforge.driver import launch

pytestmark = [pytest.mark.gpu, pytest.mark.ray]

CIFAR = Path(__file__).resolve().parents[2] / "recipes" / "cnn" / "cifar10_resnet18.yaml"
SYNTHETIC = [
    "workload.dataset=synthetic",
    "workload.synthetic_train_size=16384",
    "workload.synthetic_val_size=2048",
    "tracking.enabled=false",
]


def _gpus() -> int:
    return torch.cuda.device_count()


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_mixed_precision_on_two_gpus_over_nccl(ray_cluster, in_tmp: Path, dtype: str) -> None:
    if _gpus() < 2:
        pytest.skip("needs 2 GPUs")
    cfg = config.load(
        CIFAR,
        [f"run.name=amp-{dtype}", "scaling.use_all_gpus=false", "scaling.num_workers=2",
         f"precision.dtype={dtype}", "train.max_steps=40", "train.log_every_steps=10",
         "train.grad_accum_steps=2", "train.clip_grad_norm=5.0", *SYNTHETIC],
    )  # fmt: skip
    outcome = launch.train(cfg)
    assert outcome.exit_code == 0
    assert outcome.backend == "nccl" and outcome.num_workers == 2
    assert math.isfinite(outcome.metrics["train/loss"])
    assert math.isfinite(outcome.metrics["train/grad_norm"])
    assert 0.0 <= outcome.metrics["val/accuracy"] <= 1.0
    state = checkpoint.load(outcome.checkpoint_path)
    assert state["global_step"] == 40
    if dtype == "fp16":  # the GradScaler's state is part of the checkpoint
        assert state["scaler"]["scale"] > 0
    else:
        assert state["scaler"] == {}


def test_cifar10_resnet18_recipe_on_synthetic_data_all_gpus(ray_cluster, in_tmp: Path) -> None:
    cfg = config.load(
        CIFAR, ["train.max_steps=100", "workload.synthetic_train_size=51200", *SYNTHETIC[:1],
                *SYNTHETIC[2:]],
    )  # fmt: skip
    outcome = launch.train(cfg)
    assert outcome.exit_code == 0
    assert outcome.num_workers == _gpus() and outcome.backend == "nccl"
    assert outcome.metrics["perf/samples_per_s"] > 1000
    assert outcome.metrics["sys/gpu_mem_gb"] > 0
    print(f"cifar10 recipe, synthetic data, {_gpus()} GPUs: {outcome.metrics}")


def test_torchvision_model_by_name(ray_cluster, in_tmp: Path) -> None:
    cfg = config.load(
        CIFAR, ["run.name=tv", "scaling.use_all_gpus=false", "scaling.num_workers=1",
                "workload.model=torchvision:resnet18", "train.max_steps=10", *SYNTHETIC],
    )  # fmt: skip
    outcome = launch.train(cfg)
    assert outcome.exit_code == 0
    state = checkpoint.load(outcome.checkpoint_path)
    assert state["model"]["fc.weight"].shape == (10, 512)  # torchvision's resnet18 head


def test_tensor_data_is_kept_on_the_gpu() -> None:
    from trainforge.data.types import TensorData
    from trainforge.workloads.cnn.workload import CNNWorkload

    cfg = config.load(CIFAR, ["workload.dataset=digits", "workload.model=simple_cnn"]).workload
    train, val = CNNWorkload(cfg, seed=0).datasets(torch.device("cuda", 0))
    assert isinstance(train, TensorData) and isinstance(val, TensorData)
    assert all(t.is_cuda for t in (*train.tensors, *val.tensors))


@pytest.mark.parametrize("length", [10_000_019, 64])
def test_shard_order_on_the_gpu_covers_every_sample_and_repeats(length: int) -> None:
    """Data on a GPU gets its epoch order from the GPU's generator: the shards of three ranks
    are disjoint up to the padding, cover every sample, and the order is a function of the
    seed and the epoch."""
    from trainforge.data.sharding import TrainBatches, shard_order
    from trainforge.data.types import TensorData
    from trainforge.distributed import WorkerContext

    device = torch.device("cuda", 0)
    contexts = [WorkerContext(rank, rank, 3, 0, device) for rank in range(3)]
    shards = [shard_order(length, ctx, seed=5, epoch=2, device=device) for ctx in contexts]
    assert all(shard.device == device and len(shard) == -(-length // 3) for shard in shards)
    counts = torch.bincount(torch.cat(shards), minlength=length)
    assert bool((counts >= 1).all()) and int(counts.sum()) - length == -length % 3
    assert torch.equal(shard_order(length, contexts[1], 5, 2, device), shards[1])
    assert not torch.equal(shard_order(length, contexts[1], 5, 3, device), shards[1])

    # TrainBatches uses it for GPU-resident data, and a resume skips into the same order
    split = TensorData(torch.arange(64, device=device), torch.arange(64, device=device))
    batches = TrainBatches(split, contexts[0], batch_size=4, seed=5)
    whole = [t.tolist() for t, _ in batches.epoch(1)]
    expected = shard_order(64, contexts[0], 5, 1, device)[:20].tolist()
    assert [i for batch in whole for i in batch] == expected
    assert [t.tolist() for t, _ in batches.epoch(1, skip_batches=2)] == whole[2:]
