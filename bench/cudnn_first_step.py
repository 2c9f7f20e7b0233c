"""What cuDNN's autotuning (`torch.backends.cudnn.benchmark`) costs a run's first steps and
gives its later ones, on one GPU: the synthetic ResNet-18 recipe's step (bf16 autocast,
channels_last, fused SGD, batch 256; trainforge's ResNet-18 class, nothing else of it).

Each repeat starts a fresh process per setting, in turning order, so that every process meets
cuDNN cold (its autotuning results live in the process). Each process times its first step,
steps 2-5, the eager steady state (images/s over `--steps` steps), then trainforge's own loop on
the synthetic ResNet-18 recipe with that setting (`precision.cudnn_benchmark`), its steps
captured as one CUDA graph: the throughput a long run keeps.

    python bench/cudnn_first_step.py --repeats 3 --out cudnn_first_step.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

BATCH = 256


def one_process(benchmark: bool, steps: int) -> dict[str, float]:
    started = time.perf_counter()
    import torch

    from trainforge.workloads.cnn.models import ResNet18CIFAR

    torch.backends.cudnn.benchmark = benchmark
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    images = torch.randn(BATCH * 8, 3, 32, 32, device=device)
    labels = torch.randint(0, 10, (images.shape[0],), device=device)
    model = ResNet18CIFAR().to(device, memory_format=torch.channels_last)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, fused=True)
    torch.cuda.synchronize()
    ready = time.perf_counter()

    def step(index: int) -> None:
        rows = slice((index % 8) * BATCH, (index % 8 + 1) * BATCH)
        x = images[rows].contiguous(memory_format=torch.channels_last)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = torch.nn.functional.cross_entropy(model(x), labels[rows])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    step(0)
    torch.cuda.synchronize()
    first = time.perf_counter()
    for index in range(1, 5):
        step(index)
    torch.cuda.synchronize()
    fifth = time.perf_counter()
    for index in range(5, 5 + steps):
        step(index)
    torch.cuda.synchronize()
    steady = time.perf_counter()
    return {
        "start_s": ready - started,
        "first_step_s": first - ready,
        "steps_2_5_s": fifth - first,
        "steady_images_per_s": steps * BATCH / (steady - fifth),
        "graphed_images_per_s": trainforge_graphed(benchmark, steps),
    }


def trainforge_graphed(benchmark: bool, steps: int) -> float:
    """trainforge's loop, one GPU, graphed: samples/s over the second half of its steps."""
    import tempfile

    import torch
    import torch.distributed as dist

    from trainforge import config
    from trainforge.checkpoint import FolderReporter
    from trainforge.distributed import WorkerContext
    from trainforge.worker.payload import WorkerPayload
    from trainforge.worker.trainer import run

    recipe = Path(__file__).resolve().parents[1] / "recipes/cnn/synthetic_resnet18_bench.yaml"
    cfg = config.load(recipe, [
        f"train.max_steps={steps}", f"train.log_every_steps={steps // 2}",
        "tracking.enabled=false", f"workload.synthetic_train_size={BATCH * steps}",
        "workload.synthetic_val_size=1024", "scaling.use_all_gpus=false",
        "scaling.num_workers=1", f"precision.cudnn_benchmark={str(benchmark).lower()}",
    ])  # fmt: skip
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
    ctx = WorkerContext(0, 0, 1, 0, torch.device("cuda", 0))
    with tempfile.TemporaryDirectory(prefix="tf-cudnn-") as folder:
        reporter = FolderReporter(Path(folder))
        run(WorkerPayload(config.to_container(cfg), folder, "bench"), ctx, reporter)
    dist.destroy_process_group()
    return float(reporter.reports[-1]["perf/samples_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path("cudnn_first_step.json"))
    parser.add_argument("--one", choices=["on", "off"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(one_process(args.one == "on", args.steps)))
        return
    runs: dict[str, list[dict[str, float]]] = {"on": [], "off": []}
    for repeat in range(args.repeats):
        order = ["on", "off"] if repeat % 2 == 0 else ["off", "on"]
        for setting in order:
            command = [sys.executable, __file__, "--one", setting, "--steps", str(args.steps)]
            out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
            runs[setting].append(json.loads(out.strip().splitlines()[-1]))
            print(setting, runs[setting][-1], flush=True)
    medians = {
        setting: {key: statistics.median(run[key] for run in rows) for key in rows[0]}
        for setting, rows in runs.items()
    }
    import torch

    result: dict[str, Any] = {
        "machine": {
            "gpu": torch.cuda.get_device_name(0),
            "torch": torch.__version__,
            "python": platform.python_version(),
        },
        "batch": BATCH,
        "steps": args.steps,
        "runs": runs,
        "medians": medians,
    }
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(medians, indent=2))


if __name__ == "__main__":
    main()
