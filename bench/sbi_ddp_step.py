"""Where a multi-GPU SBI step's time goes: the 10^7 recipe's estimator (sbi MAF, hidden 128,
batch 16,384 per GPU, Adam, clipping at 5) stepped outside Ray and outside the training loop,
on 1, 2, … all GPUs of the machine, eager and captured as one CUDA graph (``GraphedStep``).

Each world size is its own process group (NCCL, one process per GPU). Each rank's batches are
gathered on the device from 10^6 two_moons simulations resident on its GPU, as in the loop.
Reported per world size and mode: milliseconds per optimizer step (median of 5 blocks of 50
steps, after warm-up) and global samples per second.

Usage (GPU machine, repo root):  python bench/sbi_ddp_step.py --out sbi_ddp_step.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BATCH = 16_384
ROWS = 1_000_000
BLOCKS, BLOCK_STEPS = 5, 50


MODES = {  # name: (captured as a CUDA graph, DDP's gradients as views into its buckets)
    "eager": (False, True),
    "graphed": (True, True),
    "graphed_grad_copies": (True, False),
}


def step_times(world: int, rank: int, graphed: bool, bucket_view: bool) -> dict[str, Any]:
    from trainforge import distributed
    from trainforge.optim import build_optimizer
    from trainforge.precision import Precision
    from trainforge.worker.step import GraphedStep, optimizer_step
    from trainforge.workloads.sbi.config import EstimatorSection, SBIWorkloadConfig
    from trainforge.workloads.sbi.tasks import get_task
    from trainforge.workloads.sbi.workload import SBIWorkload

    device = torch.device("cuda", rank)
    ctx = distributed.WorkerContext(rank, rank, world, 0, device)
    task = get_task("two_moons")
    generator = torch.Generator(device).manual_seed(rank)
    theta = task.prior_sample(ROWS, generator)
    x = task.simulate(theta, generator)
    # the recipe's estimator: MAF, hidden 128
    cfg = SBIWorkloadConfig(estimator=EstimatorSection(hidden_features=128))
    workload = SBIWorkload(cfg, seed=0)
    workload.train_theta, workload.train_x = theta[:100_000].cpu(), x[:100_000].cpu()
    workload.dim_theta, workload.dim_x = 2, 2
    torch.manual_seed(0)
    model = workload.build_model().to(device)
    train = SimpleNamespace(lr=1e-3, optimizer="adam", weight_decay=0.0)
    optimizer = build_optimizer(model, train, capturable=graphed)
    train_model = distributed.wrap(model, ctx, graphed, gradient_as_bucket_view=bucket_view)
    precision = Precision("fp32", device)

    def batch() -> tuple[torch.Tensor, torch.Tensor]:
        index = torch.randint(0, ROWS, (BATCH,), device=device, generator=generator)
        return theta[index], x[index]  # (θ, x): sbi's input and condition

    graph = None
    if graphed:  # its first steps eager, then the capture: all within the 20 untimed steps
        graph = GraphedStep(train_model, workload, optimizer, 5.0, precision.autocast)

    def one_step() -> None:
        pair = batch()
        if graph is not None:
            if graph(pair) is None:
                raise RuntimeError(graph.error)
        else:
            optimizer_step(train_model, [pair], workload, precision, optimizer, 5.0)

    for _ in range(20):
        one_step()
    times = []
    for _ in range(BLOCKS):
        torch.cuda.synchronize(device)
        dist.barrier()
        start = time.perf_counter()
        for _ in range(BLOCK_STEPS):
            one_step()
        torch.cuda.synchronize(device)
        times.append((time.perf_counter() - start) / BLOCK_STEPS * 1e3)
    ms = statistics.median(times)
    return {"ms_per_step": ms, "samples_per_s": world * BATCH / (ms / 1e3), "blocks_ms": times}


def worker(rank: int, world: int, port: int, queue: Any) -> None:
    # As Ray Train sets it, unless the caller's environment says otherwise (PyTorch's CUDA
    # notes ask for 0 when DDP is captured; whether today's NCCL process group needs it is one
    # of the things this measures).
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    torch.cuda.set_device(rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        device_id=torch.device("cuda", rank),
    )  # fmt: skip
    try:
        for mode, (graphed, bucket_view) in MODES.items():
            if world == 1 and not bucket_view:
                continue  # no DDP, no buckets
            try:
                result = step_times(world, rank, graphed, bucket_view)
            except Exception as exc:  # a failed capture is a result too
                result = {"error": " ".join(str(exc).split())[:300]}
            if rank == 0:
                queue.put((mode, result))
    finally:
        dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    gpus = torch.cuda.device_count()
    worlds = sorted({1, *[w for w in (2, 4, 8) if w <= gpus], gpus})
    results: dict[str, Any] = {}
    context = mp.get_context("spawn")
    for i, world in enumerate(worlds):
        queue = context.SimpleQueue()
        mp.start_processes(worker, (world, 29500 + i, queue), nprocs=world, start_method="spawn")
        while not queue.empty():
            mode, result = queue.get()
            results[f"{world}gpu_{mode}"] = result
            if "error" in result:
                print(f"[bench] {world} GPU(s) {mode}: failed: {result['error']}", flush=True)
                continue
            print(f"[bench] {world} GPU(s) {mode}: {result['ms_per_step']:.2f} ms/step, "
                  f"{result['samples_per_s']:,.0f} samples/s", flush=True)  # fmt: skip
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(0),
        "gpus": gpus,
        "batch_per_gpu": BATCH,
        "nccl_async_error_handling": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
        "results": results,
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
