"""A user's own workload through trainforge against the same model and data in a hand-written
torchrun script, in one invocation, rounds interleaved: the example workload (examples/wave, a
user's module outside the package) with larger data and model, training samples/s in steady
steps on each side.

- trainforge: `trainforge train examples/wave/recipe.yaml` from the example's folder, on the
  command's own worker processes (TRAINFORGE_WORKERS=own; MLflow and checkpoints as the recipe
  has them), its step lines' samples/s (each a logging window's rate) after the first window;
- hand-written: bench/own_workload_torchrun.py under torchrun, its steps after the 10th, as
  users write it (a DataLoader) and with --on-device (batches gathered where the tensors are).

Usage (repo root; CPU: 2 workers, GPU machine: one per GPU asked for):
    python bench/own_workload.py --workers 2 --rounds 3 --out own.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "wave"
STEP_RATE = re.compile(r"\] epoch \S+ step \S+ loss \S+ lr \S+ ([\d,]+) samples/s")
ANCHOR_RATE = re.compile(r"\[anchor\] samples/s (\d+)")


def trainforge_run(args: argparse.Namespace, work: Path, index: int) -> dict[str, Any]:
    env = {**os.environ, "TRAINFORGE_WORKERS": "own", "TRAINFORGE_HOME": str(work / "home")}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-m", "trainforge", "train", "recipe.yaml",
         f"run.name=bench{index}", f"run.storage_path={work / 'runs'}",
         f"tracking.tracking_uri=sqlite:///{work / 'mlflow.db'}",
         f"scaling.num_workers={args.workers}", f"train.batch_size={args.batch_size}",
         f"train.epochs={args.epochs}", "train.log_every_steps=32",
         f"workload.config.train_size={args.train_size}",
         f"workload.config.hidden={args.hidden}"],
        cwd=EXAMPLE, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    rates = [float(m[1].replace(",", "")) for m in STEP_RATE.finditer(done.stdout)]
    if done.returncode != 0 or len(rates) < 2:
        return {"error": (done.stdout + done.stderr)[-2000:]}
    return {"samples_per_s": statistics.median(rates[1:]), "windows": rates}


def torchrun_run(args: argparse.Namespace, *flags: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone",
         f"--nproc_per_node={args.workers}", str(ROOT / "bench" / "own_workload_torchrun.py"),
         f"--train-size={args.train_size}", f"--hidden={args.hidden}",
         f"--batch-size={args.batch_size}", f"--epochs={args.epochs}", *flags],
        env={**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")},
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    found = ANCHOR_RATE.search(done.stdout)
    if done.returncode != 0 or found is None:
        return {"error": (done.stdout + done.stderr)[-2000:]}
    return {"samples_per_s": float(found[1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--train-size", type=int, default=262144)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-own-bench-"))
    sides = {"trainforge": lambda i: trainforge_run(args, work, i),
             "torchrun": lambda i: torchrun_run(args),
             "torchrun_on_device": lambda i: torchrun_run(args, "--on-device")}  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for index in range(args.rounds):
        order = list(sides) if index % 2 == 0 else list(reversed(sides))
        for side in order:
            result = sides[side](index)
            runs[side].append(result)
            print(side, json.dumps(result)[:300], flush=True)
    medians = {side: statistics.median(r["samples_per_s"] for r in results)
               if all("samples_per_s" in r for r in results) else None
               for side, results in runs.items()}  # fmt: skip
    ratios = {f"trainforge/{side}": medians["trainforge"] / medians[side]
              for side in sides if side != "trainforge" and medians["trainforge"]
              and medians[side]}  # fmt: skip
    args.out.write_text(
        json.dumps(
            {
                "machine": platform.platform(),
                "args": vars(args) | {"out": str(args.out)},
                "medians": medians,
                "ratios": ratios,
                "runs": runs,
            },
            indent=1,
        )
    )
    print(json.dumps({"medians": medians, "ratios": ratios}, indent=1))


if __name__ == "__main__":
    main()
