"""Why the simulation stage is slower than sbi at one core (issue 15): the same SIR simulations
timed in four kinds of process, one core's worth each, interleaved, on the same parameters.

  here        — this process (as sbi's ``simulate_for_sbi(num_workers=1)`` simulates: in the
                calling process)
  subprocess  — a fresh Python process: torch and the simulator, no Ray, no sbi
  ray         — a Ray task on a private Ray of one CPU (the stage's worker process; Ray starts
                it at niceness RAY_worker_niceness, 15 by default)
  ray_nice0   — the same worker process, the task first setting its niceness to 0 (root may
                lower it; ``ray`` sets it back to Ray's value)

Each repeat times ``simulate`` on the same θ (``--simulations`` rows, ~2–5 ms each) in every
kind, in a turning order; rates are medians. Only the simulator call is timed: no chunk files,
no scheduling, so a gap here is the process's own speed.

    python bench/sim_one_core.py --out bench/results/sim_one_core.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
from sim_scaling import hardware, software  # noqa: E402 - bench/ is on the path from here

# a fresh process: imports torch and the simulator (and this file's few others), times as here
CHILD = """
import sys, torch
sys.path.insert(0, sys.argv[1])
from sim_one_core import timed
print(timed(torch.load(sys.argv[2])))
"""


def timed(theta: torch.Tensor, niceness: int | None = None) -> float:
    """Seconds of ``sir.simulate(theta)`` in the calling process, after a warm-up call."""
    from trainforge.workloads.sbi.examples import sir

    if niceness is not None:
        os.setpriority(os.PRIO_PROCESS, 0, niceness)
    sir.simulate(theta[:4])  # SciPy's first solve imports and warms up
    started = time.perf_counter()
    sir.simulate(theta)
    return time.perf_counter() - started


def child_says(code: str, theta_file: Path | str) -> str:
    """The last line a fresh Python process running ``code`` prints, given bench/ and
    ``theta_file`` as its arguments."""
    out = subprocess.run([sys.executable, "-c", code, str(REPO / "bench"), str(theta_file)],
                         capture_output=True, text=True, check=True)  # fmt: skip
    return out.stdout.strip().splitlines()[-1]


def in_subprocess(theta_file: Path) -> float:
    return float(child_says(CHILD, theta_file))


def one_core_setup(simulations: int) -> tuple[torch.Tensor, Path]:
    """The SIR prior's first ``simulations`` draws (seed 0) and a file holding them for a fresh
    process to read, with this process on one torch thread and connected to a private Ray of
    one CPU (as sim_scaling.py's)."""
    from trainforge.driver.cluster import connect
    from trainforge.workloads.sbi.examples import sir

    torch.set_num_threads(1)
    torch.manual_seed(0)
    theta = sir.prior().sample((simulations,))
    theta_file = Path(tempfile.mkdtemp()) / "theta.pt"
    torch.save(theta, theta_file)
    connect(local_only=True, num_cpus=1, num_gpus=0)
    return theta, theta_file


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--simulations", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    import ray

    theta, theta_file = one_core_setup(args.simulations)
    task = ray.remote(num_cpus=1)(timed)
    worker_niceness = ray.get(
        ray.remote(num_cpus=1)(lambda: os.getpriority(os.PRIO_PROCESS, 0)).remote()
    )
    kinds = {
        "here": lambda: timed(theta),
        "subprocess": lambda: in_subprocess(theta_file),
        # one worker process serves both (Ray reuses it): each sets the niceness it is about
        "ray": lambda: ray.get(task.remote(theta, worker_niceness)),
        "ray_nice0": lambda: ray.get(task.remote(theta, 0)),
    }
    order = list(kinds)
    seconds: dict[str, list[float]] = {k: [] for k in kinds}
    try:
        ray.get(task.remote(theta[:8]))  # the worker process started and warm
        for repeat in range(args.repeats):
            turn = order[repeat % len(order) :] + order[: repeat % len(order)]
            for kind in turn:
                seconds[kind].append(kinds[kind]())
            print(f"[bench] repeat {repeat + 1}: "
                  + ", ".join(f"{k} {seconds[k][-1]:.2f} s" for k in turn), flush=True)  # fmt: skip
    finally:
        ray.shutdown()
    rates = {k: args.simulations / statistics.median(v) for k, v in seconds.items()}
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "hardware": hardware(),
        "software": software(),
        "simulations": args.simulations,
        "repeats": args.repeats,
        "ray_worker_niceness": worker_niceness,
        "seconds": seconds,
        "simulations_per_s": rates,
        "relative_to_here": {k: r / rates["here"] for k, r in rates.items()},
    }
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    for kind, rate in rates.items():
        print(f"[bench] {kind:11s} {rate:7.1f} simulations/s ({rate / rates['here']:.2f} of here)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
