"""CNN training throughput: trainforge vs the loop a user would write, same machine, one run.

Both sides train the same CIFAR-style ResNet-18 on the same synthetic CIFAR-shaped data with
bf16 autocast and the same per-GPU batch:

- ``plain``: a single-GPU PyTorch loop in the style of the tutorials — a CPU ``DataLoader``
  (4 workers, pinned memory) over a ``TensorDataset``, ``.to(device)`` per batch, autocast.
- ``trainforge``: ``recipes/cnn/synthetic_resnet18_bench.yaml`` through Ray Train on 1 GPU and
  on every GPU (data resident on the GPU, channels_last, fused optimizer).

Usage (GPU machine):  python bench/cnn_throughput.py --out results.json
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "cnn" / "synthetic_resnet18_bench.yaml"


def plain_loop(batch: int, steps: int, warmup: int) -> float:
    from trainforge.workloads.cnn.models import ResNet18CIFAR

    device = torch.device("cuda", 0)
    images = torch.randn(51200, 3, 32, 32)
    labels = torch.randint(0, 10, (51200,))
    loader = DataLoader(
        TensorDataset(images, labels), batch_size=batch, shuffle=True, num_workers=4,
        pin_memory=True, drop_last=True, persistent_workers=True,
    )  # fmt: skip
    model = ResNet18CIFAR().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    done, start = 0, 0.0
    while done < warmup + steps:
        for x, y in loader:
            if done == warmup:
                torch.cuda.synchronize()
                start = time.perf_counter()
            x, y = x.to(device), y.to(device)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            done += 1
            if done == warmup + steps:
                break
    torch.cuda.synchronize()
    return batch * steps / (time.perf_counter() - start)


def trainforge_run(workers: int, batch: int, steps: int) -> dict:
    from trainforge import config
    from trainforge.driver import launch

    cfg = config.load(
        RECIPE,
        [f"run.name=bench-{workers}gpu-{time.time_ns()}", "scaling.use_all_gpus=false",
         f"scaling.num_workers={workers}", f"train.batch_size={batch}",
         f"train.max_steps={steps}", f"train.log_every_steps={steps // 2}",
         "tracking.enabled=false", "run.storage_path=/tmp/bench-runs"],
    )  # fmt: skip
    outcome = launch.train(cfg)
    assert outcome.exit_code == 0
    # the last log interval: steady state, after cudnn autotuning and warm-up
    return {
        "workers": workers,
        "samples_per_s": outcome.metrics["perf/samples_per_s"],
        "per_gpu": outcome.metrics["perf/samples_per_s"] / workers,
        "step_ms": outcome.metrics["perf/step_ms"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--out", type=Path, default=Path("cnn_throughput.json"))
    args = parser.parse_args()

    gpus = torch.cuda.device_count()
    result = {
        "benchmark": "ResNet-18 (CIFAR-style), synthetic 3x32x32, bf16 autocast",
        "per_gpu_batch": args.batch,
        "gpu": torch.cuda.get_device_name(0),
        "gpus": gpus,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "date": time.strftime("%Y-%m-%d"),
        "plain_1gpu_samples_per_s": plain_loop(args.batch, args.steps, warmup=30),
        "trainforge": [trainforge_run(1, args.batch, args.steps)],
    }
    if gpus > 1:
        result["trainforge"].append(trainforge_run(gpus, args.batch, args.steps))
    one = result["trainforge"][0]["samples_per_s"]
    result["trainforge_1gpu_vs_plain"] = one / result["plain_1gpu_samples_per_s"]
    if gpus > 1:
        result["scaling_efficiency"] = result["trainforge"][-1]["per_gpu"] / one
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
