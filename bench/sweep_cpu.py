"""A 16-trial learning-rate × batch-size sweep of the digits recipe, three ways in one
invocation, on one home's lasting local cluster (warmed first, so no side pays its start):

- by hand: the 16 `trainforge train` commands a user types today, one after another;
- grid, fifo: `trainforge sweep` of every combination, each trained to its end;
- grid, asha: the same sweep with ASHA stopping the trials that trail.

For each: wall seconds of the whole thing; the seconds the trials' runs say they trained
("run '…' finished in X s"); the epochs trained; the best setting found. The sweep's overhead
is its wall time over the commands' own (by hand), and over the runs' training seconds.

Usage (repo root):
    python bench/sweep_cpu.py --out bench/results/<date>_sweep_cpu2.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

LRS = (0.0003, 0.001, 0.003, 0.01)
BATCHES = (16, 32, 64, 128)
FINISHED = re.compile(r"run '[^']+' finished in ([\d.]+) s")
BASE = ["cnn/digits_simple_cnn", "train.log_every_steps=1000"]


def command(
    home: Path, work: Path, *arguments: str
) -> tuple[float, subprocess.CompletedProcess[str]]:
    env = {**os.environ, "TRAINFORGE_HOME": str(home), "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "trainforge", *arguments], cwd=work, env=env,
                          capture_output=True, text=True, timeout=3600)  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{arguments[:2]} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return time.perf_counter() - started, done


def by_hand(home: Path, work: Path, epochs: int) -> dict[str, Any]:
    started = time.perf_counter()
    trained, results = 0.0, []
    for index, (lr, batch) in enumerate((lr, b) for lr in LRS for b in BATCHES):
        settings = [f"train.lr={lr}", f"train.batch_size={batch}", f"train.epochs={epochs}"]
        _, done = command(home, work, "train", *BASE, f"run.name=hand{index}", *settings)
        trained += float(FINISHED.findall(done.stdout)[-1])
        loss = re.findall(r"\[trainforge\]   val/loss\s+(\S+)", done.stdout)[-1]
        results.append({"train.lr": lr, "train.batch_size": batch, "val/loss": float(loss)})
    wall = time.perf_counter() - started
    return {"wall_s": round(wall, 1), "trained_s": round(trained, 1),
            "epochs": epochs * len(results), "trials": results}  # fmt: skip


def sweep(home: Path, work: Path, name: str, scheduler: str, epochs: int) -> dict[str, Any]:
    wall, done = command(
        home, work, "sweep", *BASE, f"run.name={name}", f"train.epochs={epochs}",
        "sweep.search=grid", f"sweep.scheduler={scheduler}",
        f"sweep.space.train.lr=choice({', '.join(map(str, LRS))})",
        f"sweep.space.train.batch_size=choice({', '.join(map(str, BATCHES))})",
    )  # fmt: skip
    folder = work / "runs" / name
    with open(folder / "trials.csv") as stream:
        rows = list(csv.DictReader(stream))
    trained = 0.0
    for row in rows:
        said = FINISHED.findall((folder / "trials" / f"{row['trial']}.log").read_text())
        trained += float(said[-1]) if said else 0.0  # a stopped trial's run says no end
    return {
        "wall_s": round(wall, 1), "trained_s_of_finished_runs": round(trained, 1),
        "epochs": sum(int(r["epochs"]) for r in rows),
        "stopped_early": sum(r["state"] == "stopped early" for r in rows),
        "trials": [{"train.lr": float(r["train.lr"]),
                    "train.batch_size": int(r["train.batch_size"]),
                    "val/loss": float(r["val/loss"]) if r["val/loss"] else None,
                    "epochs": int(r["epochs"]), "state": r["state"]} for r in rows],
        "console": done.stdout[-4000:],
    }  # fmt: skip


def best(trials: list[dict[str, Any]], finished_only: bool = False) -> list[tuple[float, int]]:
    scored = [t for t in trials if t["val/loss"] is not None]
    if finished_only:
        scored = [t for t in scored if t.get("state", "finished") == "finished"]
    scored.sort(key=lambda t: t["val/loss"])
    return [(t["train.lr"], t["train.batch_size"]) for t in scored]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-sweep-bench-"))
    home = work / "home"
    command(home, work, "train", *BASE, "run.name=warm", "train.epochs=1")  # cluster + workers
    hand = by_hand(home, work, args.epochs)
    fifo = sweep(home, work, "grid-fifo", "fifo", args.epochs)
    asha = sweep(home, work, "grid-asha", "asha", args.epochs)
    grid_best_two = best(fifo["trials"])[:2]
    asha_best = best(asha["trials"], finished_only=True)[0]
    result = {
        "bench": "bench/sweep_cpu.py", "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "space": {"train.lr": LRS, "train.batch_size": BATCHES}, "epochs": args.epochs,
        "by_hand": hand, "grid_fifo": fifo, "grid_asha": asha,
        "summary": {
            "sweep_over_by_hand_wall": round(fifo["wall_s"] / hand["wall_s"], 3),
            "sweep_overhead_over_training":
                round(fifo["wall_s"] / fifo["trained_s_of_finished_runs"] - 1, 3),
            "by_hand_overhead_over_training": round(hand["wall_s"] / hand["trained_s"] - 1, 3),
            "asha_epochs_share": round(asha["epochs"] / fifo["epochs"], 3),
            "asha_wall_share": round(asha["wall_s"] / fifo["wall_s"], 3),
            "grid_best_two": grid_best_two, "asha_best": asha_best,
            "asha_best_in_grid_best_two": asha_best in grid_best_two,
        },
    }  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["summary"], indent=1))
    stop = [sys.executable, "-m", "trainforge", "cluster", "stop"]
    subprocess.run(stop, env={**os.environ, "TRAINFORGE_HOME": str(home)}, capture_output=True)


if __name__ == "__main__":
    main()
