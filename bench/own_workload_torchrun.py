"""The hand-written side of bench/own_workload.py: what a user writes by hand with torchrun for
the example workload (examples/wave: its model and its data, imported from the user's module)
— DDP (gloo on CPU, NCCL on a GPU), a TensorDataset through a DataLoader with a
DistributedSampler, AdamW, fp32 — timing its steps from the WARMUP-th to the last: it prints
`[anchor] samples/s R`. With --on-device, what an expert writes instead: no DataLoader, each
epoch a shuffled permutation of the rank's share, batches gathered from the tensors where they
are (on the GPU).

    torchrun --standalone --nproc_per_node=2 bench/own_workload_torchrun.py \
        --train-size 262144 --hidden 256 --batch-size 512 --epochs 2
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "wave"))
from wave_task import WaveConfig, WaveRegression  # the user's own module

WARMUP = 10  # steps left out of the rate: the first ones allocate and warm caches


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--train-size", type=int, default=262144)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--on-device", action="store_true")
    args = parser.parse_args()
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    workload = WaveRegression(WaveConfig(hidden=args.hidden, train_size=args.train_size), seed=0)
    (x, y), _ = workload.datasets(device)
    if args.on_device:
        batches = lambda epoch: on_device_batches(x, y, args.batch_size, epoch, rank, world)  # noqa: E731
    else:
        data = TensorDataset(x, y)
        sampler = DistributedSampler(data, seed=0, drop_last=True)
        loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, drop_last=True,
                            pin_memory=cuda)  # fmt: skip

        def batches(epoch: int):  # type: ignore[no-untyped-def]
            sampler.set_epoch(epoch)
            return loader

    torch.manual_seed(0)
    model = DistributedDataParallel(workload.build_model().to(device))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    steps, started = 0, 0.0
    for epoch in range(args.epochs):
        for batch_x, batch_y in batches(epoch):
            batch_x = batch_x.to(device, non_blocking=True)
            batch_y = batch_y.to(device, non_blocking=True)
            loss = nn.functional.mse_loss(model(batch_x), batch_y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
            if steps == WARMUP:
                loss.item()  # the device has done the warm-up steps
                started = time.perf_counter()
    loss.item()
    elapsed = time.perf_counter() - started
    if rank == 0:
        rate = (steps - WARMUP) * args.batch_size * world / elapsed
        print(f"[anchor] samples/s {rate:.0f} over {steps - WARMUP} steps", flush=True)
    dist.destroy_process_group()


def on_device_batches(x: torch.Tensor, y: torch.Tensor, batch: int, epoch: int, rank: int,
                      world: int):  # type: ignore[no-untyped-def]  # fmt: skip
    generator = torch.Generator(device="cpu").manual_seed(epoch)
    order = torch.randperm(len(x), generator=generator).to(x.device)
    share = order[rank : len(order) // world * world : world]
    for start in range(0, len(share) - batch + 1, batch):
        index = share[start : start + batch]
        yield x[index], y[index]


if __name__ == "__main__":
    main()
