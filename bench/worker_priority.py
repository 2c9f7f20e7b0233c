"""Worker priority: a Ray task's CPU-bound work on a machine whose cores other processes keep
busy, with Ray's default (workers at nice 15) and with workers at the command's priority
(``RAY_worker_niceness=0``), in one invocation, interleaved.

Each measurement is a fresh process that starts trainforge's private local Ray (as a command
with ``TRAINFORGE_KEEP_CLUSTER=0``, and the test suite, do), times one task of ~0.3 s of CPU
with the machine idle, then starts one spinning process per core (nice 0, in the same session:
a user's other work) and times the same task again. Reported: the task's wall and CPU seconds;
wall ÷ CPU is how much longer the work took than the CPU it needed.

    python bench/worker_priority.py --repeats 3 --out bench/results/worker_priority.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

WORK = 3_000_000  # loop iterations: ~0.2-0.3 s of one core here


def spin() -> None:
    while True:
        pass


def probe() -> None:
    """One measurement (run in its own process): JSON on stdout."""
    import ray

    from trainforge.driver.cluster import connect

    cores = len(os.sched_getaffinity(0))
    connect(local_only=True, num_cpus=cores)

    @ray.remote(num_cpus=1)
    def work(n: int) -> tuple[int, float, float]:
        wall, cpu = time.perf_counter(), time.process_time()
        total = 0
        for i in range(n):
            total += i * i
        return os.nice(0), time.perf_counter() - wall, time.process_time() - cpu

    ray.get(work.remote(10))  # the worker process is up
    idle = ray.get(work.remote(WORK))
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(cores)]
    for spinner in spinners:
        spinner.start()
    time.sleep(1.0)
    busy = ray.get(work.remote(WORK))
    for spinner in spinners:
        spinner.terminate()
    ray.shutdown()
    print(json.dumps({"worker_niceness": busy[0], "idle": idle[1:], "busy": busy[1:]}))


def measure(ray_default: bool) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env["RAY_worker_niceness"] = "15" if ray_default else "0"  # 15: what Ray does unless told
    done = subprocess.run([sys.executable, __file__, "--probe"], env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    line = next(x for x in done.stdout.splitlines() if x.startswith("{"))
    result = json.loads(line)
    result["busy_wall_over_cpu"] = result["busy"][0] / result["busy"][1]
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="worker_priority.json")
    parser.add_argument("--probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.probe:
        probe()
        return 0
    runs: dict[str, list[dict[str, Any]]] = {"niceness_0": [], "ray_default": []}
    for _ in range(args.repeats):
        for label in runs:
            runs[label].append(measure(label == "ray_default"))
            print(label, json.dumps(runs[label][-1]), flush=True)
    medians = {
        label: {
            "busy_wall_s": statistics.median(r["busy"][0] for r in results),
            "busy_cpu_s": statistics.median(r["busy"][1] for r in results),
            "idle_wall_s": statistics.median(r["idle"][0] for r in results),
            "busy_wall_over_cpu": statistics.median(r["busy_wall_over_cpu"] for r in results),
            "worker_niceness": results[0]["worker_niceness"],
        }
        for label, results in runs.items()
    }
    report = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "usable_cpus": len(os.sched_getaffinity(0)),
            "sched_autogroup": Path("/proc/sys/kernel/sched_autogroup_enabled").read_text().strip()
            if Path("/proc/sys/kernel/sched_autogroup_enabled").exists()
            else None,
        },
        "medians": medians,
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(medians, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
