"""CNN training throughput: trainforge against the DDP script a user would write by hand.

One invocation measures, on one host, for 1 GPU and for every GPU:

- ``torchrun``: a hand-written DDP training script (``handwritten`` below) run by torchrun —
  CIFAR-style ResNet-18, channels_last, bf16 autocast, the data on the GPU and each batch
  gathered there by random index, cuDNN autotuning, the fused optimizer (SGD with Nesterov
  momentum, or AdamW), ``zero_grad(set_to_none)``; DDP when there are several processes.
- ``eager``: trainforge's worker loop (``trainforge.worker.trainer.run``, what every Ray Train
  worker runs) on ``recipes/cnn/synthetic_resnet18_bench.yaml`` with
  ``precision.cuda_graphs=false``: the same model, optimizer, batch and precision, plus what
  the loop does (metrics every ``log_every_steps``, the LR schedule, checkpoint at the end).
- ``graphed``: the same with the recipe's own ``precision.cuda_graphs: auto`` (the whole step
  replayed as one CUDA graph).

Both sides run under the same torchrun launch and process group, the variants of one
configuration in a rotating order, so a repeat compares them on the same machine minutes
apart; ``--repeats`` launches per GPU count, medians reported. trainforge's loop is started
by torchrun here rather than by Ray Train (which starts the same function in its workers): Ray's
startup (~30 s) is no part of a step. Throughput is measured over the second half of each
run's steps (after cuDNN autotuning and graph capture), the trainforge side from its own
``perf/samples_per_s`` over its last logging interval.

Each launch's environment has what trainforge's GPU workers set for themselves
(``trainforge.worker.environment.GPU_WORKER_ENV``: one CUDA work queue per GPU), so the trainforge
side runs as a `trainforge train` worker does; the hand-written side, in the same processes,
gets it too, which can only help it. ``--default-cuda-env`` launches without it.

Also ``tutorial``: the classic single-GPU tutorial loop (fp32, a CPU DataLoader with 4
workers and pinned memory, ``.to(device)`` per batch, non-fused SGD) as the floor.

Usage (GPU machine):  python bench/cnn_throughput.py --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "cnn" / "synthetic_resnet18_bench.yaml"
VARIANTS = ("torchrun", "eager", "graphed")
LR = {"sgd": 0.1, "adamw": 1e-3}
MOMENTUM, WEIGHT_DECAY = 0.9, 5e-4  # the CIFAR recipe's SGD
DATA = 51200  # synthetic CIFAR-shaped images per GPU in the hand-written script


# --------------------------------------------------------------------------- the hand-written side


def handwritten_step(optimizer_name: str, batch: int, device: torch.device) -> Callable[[], None]:
    """The script a user would write, set up on ``device``: its training step (DDP when a
    process group of several ranks exists)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from trainforge.workloads.cnn.models import ResNet18CIFAR

    grouped = torch.distributed.is_initialized()
    world = torch.distributed.get_world_size() if grouped else 1
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(torch.distributed.get_rank() if grouped else 0)
    images = torch.randn(DATA, 3, 32, 32, device=device).contiguous(
        memory_format=torch.channels_last
    )
    labels = torch.randint(0, 10, (DATA,), device=device)
    torch.manual_seed(0)
    model: torch.nn.Module = ResNet18CIFAR().to(device, memory_format=torch.channels_last)
    if world > 1:
        model = DDP(model, device_ids=[device.index])
    if optimizer_name == "sgd":
        optimizer: torch.optim.Optimizer = torch.optim.SGD(
            model.parameters(), lr=LR["sgd"], momentum=MOMENTUM, nesterov=True,
            weight_decay=WEIGHT_DECAY, fused=True,
        )  # fmt: skip
    else:
        optimizer = torch.optim.AdamW(
            model.parameters(), lr=LR["adamw"], weight_decay=WEIGHT_DECAY, fused=True
        )

    def step() -> None:
        idx = torch.randint(0, DATA, (batch,), device=device)
        x, y = images[idx], labels[idx]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return step


def handwritten(optimizer_name: str, batch: int, steps: int) -> float:
    """The whole DDP script a user would write, minus argument parsing: samples/s (all GPUs)
    over its second half."""
    world = torch.distributed.get_world_size()
    step = handwritten_step(
        optimizer_name, batch, torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    )
    start = 0.0
    for i in range(steps):
        if i == steps // 2:
            torch.cuda.synchronize()
            start = time.perf_counter()
        step()
    torch.cuda.synchronize()
    return world * batch * (steps - steps // 2) / (time.perf_counter() - start)


# --------------------------------------------------------------------------- the trainforge side


def trainforge_loop(
    optimizer_name: str, batch: int, steps: int, graphs: bool, extra: Sequence[str] = ()
) -> float:
    """trainforge's worker loop on the bench recipe in this torchrun process: samples/s (all
    GPUs) over its last logging interval, the second half of its steps; ``extra``: more recipe
    overrides."""
    from trainforge import config
    from trainforge.checkpoint import FolderReporter
    from trainforge.distributed import WorkerContext
    from trainforge.worker.payload import WorkerPayload
    from trainforge.worker.trainer import run

    world, rank = torch.distributed.get_world_size(), torch.distributed.get_rank()
    local = int(os.environ["LOCAL_RANK"])
    cfg = config.load(
        RECIPE,
        [f"train.optimizer={optimizer_name}", f"train.lr={LR[optimizer_name]}",
         f"train.momentum={MOMENTUM}", f"train.weight_decay={WEIGHT_DECAY}",
         f"train.batch_size={batch}", f"train.max_steps={steps}",
         f"train.log_every_steps={steps // 2}", "tracking.enabled=false",
         # one epoch holds every step: no epoch boundary inside the measured half
         f"workload.synthetic_train_size={batch * world * steps}",
         "workload.synthetic_val_size=1024", "scaling.use_all_gpus=false",
         f"scaling.num_workers={world}",
         f"precision.cuda_graphs={'auto' if graphs else 'false'}", *extra],
    )  # fmt: skip
    ctx = WorkerContext(rank, local, world, 0, torch.device("cuda", local))
    with tempfile.TemporaryDirectory(prefix="tf-bench-") as folder:
        reporter = FolderReporter(Path(folder))
        run(WorkerPayload(config.to_container(cfg), folder, "bench"), ctx, reporter)
    if rank != 0:
        return 0.0
    return float(reporter.reports[-1]["perf/samples_per_s"])


def worker(args: argparse.Namespace) -> None:
    """One torchrun process: every configuration, its variants in a rotating order."""
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    torch.distributed.init_process_group(
        "nccl", device_id=torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    )
    rows = []
    for i, (optimizer_name, batch, variants) in enumerate(configurations(args)):
        steps = max(args.min_steps, args.steps * 256 // batch)
        shift = (i + args.repeat) % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            if variant == "torchrun":
                value = handwritten(optimizer_name, batch, steps)
            else:
                value = trainforge_loop(optimizer_name, batch, steps, variant == "graphed")
            rows.append({"optimizer": optimizer_name, "batch": batch, "variant": variant,
                         "steps": steps, "samples_per_s": value})  # fmt: skip
            torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:
        Path(args.result).write_text(json.dumps(rows))
    torch.distributed.destroy_process_group()


def configurations(args: argparse.Namespace) -> list[tuple[str, int, list[str]]]:
    """(optimizer, per-GPU batch, variants): graphed only at --graph-batches."""
    return [
        (name, batch, [v for v in VARIANTS if v != "graphed" or batch in args.graph_batches])
        for name in args.optimizers
        for batch in args.batches
    ]


# --------------------------------------------------------------------------- the tutorial floor


def tutorial(batch: int, steps: int) -> float:
    """The classic single-GPU tutorial loop, fp32: samples/s over the second half."""
    from torch.utils.data import DataLoader, TensorDataset

    from trainforge.workloads.cnn.models import ResNet18CIFAR

    device = torch.device("cuda", 0)
    data = TensorDataset(torch.randn(DATA, 3, 32, 32), torch.randint(0, 10, (DATA,)))
    loader = DataLoader(data, batch_size=batch, shuffle=True, num_workers=4, pin_memory=True,
                        drop_last=True, persistent_workers=True)  # fmt: skip
    model = ResNet18CIFAR().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=MOMENTUM)
    done, start = 0, 0.0
    while done < steps:
        for x, y in loader:
            if done == steps // 2:
                torch.cuda.synchronize()
                start = time.perf_counter()
            x, y = x.to(device), y.to(device)
            loss = F.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            done += 1
            if done == steps:
                break
    torch.cuda.synchronize()
    return batch * (steps - steps // 2) / (time.perf_counter() - start)


# --------------------------------------------------------------------------- the whole bench


def launch(args: argparse.Namespace, gpus: int, repeat: int) -> list[dict[str, Any]]:
    with tempfile.NamedTemporaryFile(suffix=".json") as result:
        command = [
            sys.executable, "-m", "torch.distributed.run", "--standalone",
            f"--nproc_per_node={gpus}", __file__, "--worker", f"--result={result.name}",
            f"--repeat={repeat}", f"--steps={args.steps}", f"--min-steps={args.min_steps}",
            "--optimizers", *args.optimizers, "--batches", *map(str, args.batches),
            "--graph-batches", *map(str, args.graph_batches),
        ]  # fmt: skip
        env = dict(os.environ)
        if not args.default_cuda_env:
            from trainforge.worker import environment

            env |= environment.gpu_worker_env(os.environ)
        started = time.perf_counter()
        subprocess.run(command, check=True, timeout=args.launch_timeout, env=env)
        rows = json.loads(Path(result.name).read_text())
    print(f"[bench] {gpus} GPU(s), repeat {repeat}: {time.perf_counter() - started:.0f} s")
    return [{"gpus": gpus, "repeat": repeat, **row} for row in rows]


def hardware() -> dict[str, Any]:
    smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
    cpu = next(
        (line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
         if line.startswith("model name")), platform.processor(),
    )  # fmt: skip
    topology = subprocess.run(["nvidia-smi", "topo", "-m"], capture_output=True, text=True)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "gpus": torch.cuda.device_count(),
        "nvidia_smi": smi.strip().splitlines(),
        "topology": topology.stdout.strip().splitlines()[:6],
        "cpu": cpu,
        "cpu_cores": os.cpu_count(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "nccl": ".".join(map(str, torch.cuda.nccl.version())),
        "python": platform.python_version(),
    }


def summarize(rows: list[dict[str, Any]], tutorial_runs: list[float]) -> dict[str, Any]:
    values: dict[str, dict[str, list[float]]] = {}
    for row in rows:
        key = f"{row['optimizer']}/batch{row['batch']}/{row['gpus']}gpu"
        values.setdefault(key, {}).setdefault(row["variant"], []).append(row["samples_per_s"])
    medians: dict[str, dict[str, float]] = {}
    for key, runs in values.items():
        cell = medians[key] = {v: statistics.median(runs[v]) for v in VARIANTS if v in runs}
        for variant in ("eager", "graphed"):
            if variant in cell:
                cell[f"{variant}_vs_torchrun"] = cell[variant] / cell["torchrun"]
    summary: dict[str, Any] = {"medians": medians}
    gpus = max(r["gpus"] for r in rows)
    if gpus > 1:
        summary["weak_scaling_per_gpu"] = {
            f"{key}/{variant}": value / gpus / medians[key.replace(f"{gpus}gpu", "1gpu")][variant]
            for key, cell in medians.items() if key.endswith(f"/{gpus}gpu")
            for variant, value in cell.items() if variant in VARIANTS
        }  # fmt: skip
    if tutorial_runs:
        summary["tutorial_1gpu_fp32"] = statistics.median(tutorial_runs)
        shipped = medians.get("sgd/batch256/1gpu", {}).get("graphed")
        if shipped:
            summary["shipped_1gpu_vs_tutorial"] = shipped / summary["tutorial_1gpu_fp32"]
    return summary


def merge(files: list[Path], out: Path) -> None:
    """One result from the repeats of several invocations on one host (a device call's time
    limit can cut a run of all repeats): their runs together, summarized again."""
    parts = [json.loads(f.read_text()) for f in files]
    result = {k: v for k, v in parts[0].items() if k not in ("wall_s",)}
    result["merged_from"] = [f.name for f in files]
    result["settings"] = [p["settings"] for p in parts]
    result["runs"] = [run for p in parts for run in p["runs"]]
    result["tutorial_runs"] = [t for p in parts for t in p["tutorial_runs"]]
    result |= summarize(result["runs"], result["tutorial_runs"])
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps({k: v for k, v in result.items() if k not in ("runs", "settings")}, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("cnn_throughput.json"))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--first-repeat", type=int, default=0, help="number of the first repeat (its order)"
    )
    parser.add_argument("--steps", type=int, default=200, help="steps per run at batch 256")
    parser.add_argument("--min-steps", type=int, default=60)
    parser.add_argument("--optimizers", nargs="+", default=["sgd", "adamw"])
    parser.add_argument("--batches", nargs="+", type=int, default=[256, 1024])
    parser.add_argument("--graph-batches", nargs="+", type=int, default=[256])
    parser.add_argument("--gpus", nargs="+", type=int, default=None)
    parser.add_argument("--tutorial-steps", type=int, default=100)
    parser.add_argument("--launch-timeout", type=int, default=300)
    parser.add_argument(
        "--default-cuda-env", action="store_true",
        help="launch without the CUDA settings trainforge's GPU workers give themselves",
    )  # fmt: skip
    parser.add_argument(
        "--merge", nargs="+", type=Path, help="summarize these results files (calls of one host)"
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", default="", help=argparse.SUPPRESS)
    parser.add_argument("--repeat", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.merge:
        merge(args.merge, args.out)
        return
    counts = args.gpus or sorted({1, torch.cuda.device_count()})
    result: dict[str, Any] = {
        "benchmark": "ResNet-18 (CIFAR-style), synthetic 3x32x32 on the GPU, bf16 autocast, "
        "channels_last; per-GPU batch; samples/s over all GPUs",
        "date": time.strftime("%Y-%m-%d"),
        "hardware": hardware(),
        "settings": {k: v for k, v in vars(args).items() if k not in ("worker", "result", "out")},
        "runs": [],
        "tutorial_runs": [],
    }
    started = time.perf_counter()
    for repeat in range(args.first_repeat, args.first_repeat + args.repeats):
        for gpus in counts:
            result["runs"] += launch(args, gpus, repeat)
        if args.tutorial_steps:
            result["tutorial_runs"].append(tutorial(256, args.tutorial_steps))
        result |= summarize(result["runs"], result["tutorial_runs"])
        result["wall_s"] = round(time.perf_counter() - started, 1)
        args.out.write_text(json.dumps(result, indent=2))  # what is done so far survives a kill
    print(json.dumps({k: v for k, v in result.items() if k not in ("runs",)}, indent=2))


if __name__ == "__main__":
    main()
