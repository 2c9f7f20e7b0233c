"""An SBI sweep against the shipped recipe it searches around, in one invocation: the shipped
`npe_1e5` on one task as `trainforge train` runs it, then `trainforge sweep` of the same recipe
over the flow's size and the learning rate (a grid, each trial to its end: the score is the
C2ST measured at a run's end). Records each side's wall, the shipped run's C2ST, every trial's
and the best one's. `--part together` runs the shipped recipe beside the sweep (its trials
sharing the GPU with it, `--at-once` of them at a time). The shipped flow (nflows' `nsf`) runs
eager on a GPU, ~1,000 s a two_moons run on one H100: `--set workload.estimator.model=zuko_nsf
precision.cuda_graphs=true` on both sides ends the whole comparison in ~3 min. With --work in a
folder kept between calls, a call cut by its limit is run again and both sides resume (the
sweep's walls are added).

Usage (repo root; the GPU machine, or any):
    python bench/sweep_sbi_gpu.py --task slcp --out sweep_sbi.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "sbi" / "npe_1e5.yaml"


def command(work: Path, *arguments: str) -> dict[str, Any]:
    """One `trainforge` command in ``work``, its lines into ``<command>.log`` there as they
    come (a call cut by its time limit leaves them); a re-run resumes what it left."""
    started = time.perf_counter()
    log_file = work / f"{arguments[0]}.log"
    with log_file.open("a") as out:
        done = subprocess.run([sys.executable, "-m", "trainforge", *arguments], cwd=work,
                              stdout=out, stderr=subprocess.STDOUT, timeout=3000)  # fmt: skip
    code = done.returncode
    wall = time.perf_counter() - started
    return {"exit_code": code, "wall_s": round(wall, 1), "tail": log_file.read_text()[-1500:]}


def train_shipped(work: Path, common: list[str], kept: Path) -> dict[str, Any]:
    """The shipped recipe as `trainforge train` runs it, its result also kept in ``kept``."""
    shipped = command(work, "train", *common, "run.name=shipped")
    record = work / "runs" / "shipped" / "finished.json"
    shipped["metrics"] = json.loads(record.read_text())["metrics"] if record.is_file() else {}
    kept.write_text(json.dumps(shipped, indent=1))
    return shipped


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", type=Path, default=RECIPE)
    parser.add_argument("--task", default="slcp")
    parser.add_argument("--set", nargs="*", default=[], help="more overrides, both sides")
    parser.add_argument("--hidden", default="50, 100")
    parser.add_argument("--lr", default="5e-4, 2e-3")
    parser.add_argument("--at-once", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--work", type=Path, help="a folder kept between calls (default: new)")
    parser.add_argument("--part", choices=("both", "shipped", "sweep", "together"), default="both")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="tf-sweep-sbi-"))
    work.mkdir(parents=True, exist_ok=True)
    common = [str(args.recipe.resolve()), f"workload.task={args.task}",
              "workload.evaluation.observations_from=own", *args.set]  # fmt: skip
    kept = work / "shipped.json"  # the shipped run of an earlier call with this --work
    beside: threading.Thread | None = None
    if args.part == "sweep" and kept.is_file():
        shipped = json.loads(kept.read_text())
    elif args.part == "together":
        beside = threading.Thread(target=train_shipped, args=(work, common, kept))
        beside.start()
    else:
        shipped = train_shipped(work, common, kept)
    if beside is None:
        args.out.write_text(json.dumps({"shipped": shipped}, indent=1))  # kept if the sweep is cut
        print("shipped c2st/mean", shipped["metrics"].get("c2st/mean"), "wall",
              shipped["wall_s"], flush=True)  # fmt: skip
    if args.part == "shipped":
        return
    sweep = command(
        work, "sweep", *common, "run.name=sw", "sweep.search=grid", "sweep.scheduler=fifo",
        "sweep.metric=c2st/mean", f"sweep.at_once={args.at_once}",
        f"sweep.space.workload.estimator.hidden_features=choice({args.hidden})",
        f"sweep.space.train.lr=choice({args.lr})",
    )  # fmt: skip
    if beside is not None:
        beside.join()
        shipped = json.loads(kept.read_text())
    calls = work / "sweep_calls.json"  # each call's wall: a sweep cut by a call's limit resumes
    walls = [*(json.loads(calls.read_text()) if calls.is_file() else []), sweep["wall_s"]]
    calls.write_text(json.dumps(walls))
    sweep["wall_s_all_calls"] = round(sum(walls), 1)
    table = work / "runs" / "sw" / "trials.csv"
    trials = list(csv.DictReader(table.open())) if table.is_file() else []
    scored = [t for t in trials if t["state"] == "finished" and t["c2st/mean"]]
    best = min(scored, key=lambda t: float(t["c2st/mean"])) if scored else None
    result = {
        "machine": platform.platform(),
        "gpu": os.environ.get("GPU_NAME", ""),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "shipped": shipped,
        "sweep": sweep,
        "trials": trials,
        "best": best,
        "best_c2st_le_shipped": (
            float(best["c2st/mean"]) <= float(shipped["metrics"]["c2st/mean"])
            if best and "c2st/mean" in shipped["metrics"]
            else None
        ),
    }
    args.out.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("best", "best_c2st_le_shipped")}, indent=1))
    print("shipped c2st/mean", shipped["metrics"].get("c2st/mean"), "wall", shipped["wall_s"],
          "| sweep wall", sweep["wall_s_all_calls"], "over", len(walls), "calls")  # fmt: skip


if __name__ == "__main__":
    main()
