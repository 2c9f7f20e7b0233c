"""The Ray Train anchor of bench/startup.py on GPUs: startup_torchrun_resnet.py's steps as a Ray
Train user writes them — a TorchTrainer (Ray Train's own NCCL process group), one worker per
GPU, on the cluster that RAY_ADDRESS names — timed from the shell to its first optimizer step
(the worker prints `[anchor] first step`; `[anchor] worker` as its training function begins).
Beside trainforge's Ray Train path on the same kind of cluster it says what Ray Train itself
costs a run's start.

    RAY_ADDRESS=127.0.0.1:6379 python bench/startup_raytrain_resnet.py --workers 1
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

import ray.train
from ray.train.torch import TorchTrainer, get_device

BENCH = str(Path(__file__).resolve().parent)


def train_fn(config: dict[str, Any]) -> None:
    print("[anchor] worker", flush=True)
    sys.path.insert(0, config["bench"])  # a worker's Python path does not hold bench/
    import startup_torchrun_resnet

    startup_torchrun_resnet.train(get_device())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    trainer = TorchTrainer(
        train_fn,
        train_loop_config={"bench": BENCH},
        scaling_config=ray.train.ScalingConfig(num_workers=args.workers, use_gpu=True),
        run_config=ray.train.RunConfig(storage_path=tempfile.mkdtemp(prefix="tf-anchor-")),
    )
    trainer.fit()


if __name__ == "__main__":
    main()
