"""SBI multi-GPU scaling: ``recipes/sbi/two_moons_1e7_gpu.yaml`` (10^7 simulations, MAF, the whole
step a CUDA graph, or ``--eager``) on one GPU and on every GPU of the machine, same per-GPU
batch, in one invocation.

The figure is the loop's steady-state ``perf/samples_per_s``: global samples per second over
the last logging window, after a first window of warm-up (and graph capture). A window is 548
steps: one epoch of the 1-GPU run and four of the 4-GPU run (137 steps each), so both include
their epoch starts. Evaluation and checkpoints are moved out of the measured steps, and one-off
costs (Ray start, loading 10^7 simulations onto each GPU, building the flow) are left out; the
wall time of each run is reported.

Usage (multi-GPU machine, repo root):  python bench/sbi_scaling.py --out sbi_scaling.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
RECIPE = ROOT / "recipes" / "sbi" / "two_moons_1e7_gpu.yaml"
QUIET = [
    "tracking.enabled=false",
    "workload.evaluation.c2st=false",
    "workload.evaluation.sbc_runs=0",
    "workload.evaluation.pair_plot=false",
    "workload.evaluation.observations=[1]",
    "train.early_stopping_patience=0",
    # no evaluation or checkpoint inside the measured windows
    "train.eval_every_epochs=100000",
    "checkpoint.every_epochs=100000",
]


def run(name: str, storage: Path, overrides: list[str]) -> dict[str, Any]:
    from recipe_run import train_recipe

    _, _, result = train_recipe(RECIPE, name, storage, [*QUIET, *overrides])
    print(f"[bench] {json.dumps(result)}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--window", type=int, default=548, help="steps per measured window")
    parser.add_argument("--windows", type=int, default=3, help="windows per run (first: warm-up)")
    parser.add_argument(
        "--eager", action="store_true", help="both runs without the recipe's CUDA graphs"
    )
    args = parser.parse_args()
    storage = Path(tempfile.mkdtemp(prefix="sbi-scaling-")) / "runs"
    os.environ.setdefault("OMP_NUM_THREADS", "4")
    common = [
        f"train.max_steps={args.window * args.windows}",
        f"train.log_every_steps={args.window}",
        f"precision.cuda_graphs={not args.eager}",
    ]
    one = run(
        "scaling_1gpu", storage, [*common, "scaling.use_all_gpus=false", "scaling.num_workers=1"]
    )
    every = run("scaling_all_gpus", storage, common)
    report = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(0),
        "gpus": torch.cuda.device_count(),
        "recipe": str(RECIPE.relative_to(ROOT)),
        "cuda_graphs": not args.eager,
        "one_gpu": one,
        "all_gpus": every,
        "speedup": (every["samples_per_s"] or 0) / (one["samples_per_s"] or float("inf")),
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"[bench] {report['gpus']} GPUs vs 1: {report['speedup']:.2f}x")


if __name__ == "__main__":
    main()
