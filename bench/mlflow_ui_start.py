"""What `trainforge ui`'s MLflow server costs to start, with and without MLflow's job runner.

MLflow 3.17's server starts a job runner by default (its GenAI jobs: scorers, prompt
optimisation) beside the web server: a supervisor and several huey consumers, each a Python
process importing MLflow. `trainforge ui` turns it off (MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false)
unless the user set it. This runs the same server command both ways, alternating, in one
invocation, and records for each start:

  health_s     seconds from the command's start to /health answering 200
  processes    the server's process tree after ``--settle-s`` seconds
  rss_mb       their resident memory then, summed
  cpu_s        CPU-seconds the whole machine spent from the start to then (this machine does
               nothing else meanwhile; the server's children are not all reaped, so the
               machine's counters are read, not the tree's)

    python bench/mlflow_ui_start.py --repeats 3 --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

MODES = {"jobs_on": "true", "jobs_off": "false"}


def machine_cpu_s() -> float:
    """User + nice + system time of every CPU since boot, in seconds (/proc/stat)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    return sum(int(x) for x in fields[:3]) / os.sysconf("SC_CLK_TCK")


def tree(root: int) -> list[int]:
    """``root`` and every process below it (parents read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(children.get(pid, []))
    return found


def rss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


def one_start(jobs: str, settle_s: float) -> dict[str, Any]:
    """One server start, as `trainforge ui` runs it, on a new SQLite store."""
    folder = Path(tempfile.mkdtemp(prefix="mlflow-ui-bench-"))
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": jobs,
           "MLFLOW_DISABLE_TELEMETRY": "true"}  # fmt: skip
    command = ["mlflow", "ui", "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}",
               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"]  # fmt: skip
    cpu_before, started = machine_cpu_s(), time.monotonic()
    server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        while not answers(f"http://127.0.0.1:{port}/health"):
            if server.poll() is not None or time.monotonic() - started > 180:
                raise RuntimeError(f"the server never answered (jobs {jobs})")
            time.sleep(0.1)
        health_s = time.monotonic() - started
        time.sleep(max(0.0, settle_s - health_s))
        pids = tree(server.pid)
        return {
            "health_s": round(health_s, 2),
            "processes": len(pids),
            "rss_mb": round(rss_mb(pids)),
            "cpu_s": round(machine_cpu_s() - cpu_before, 1),
        }
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=60)
        time.sleep(2)  # its children end with it
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--settle-s", type=float, default=25.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    import mlflow

    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in MODES}
    for repeat in range(args.repeats):
        for mode, jobs in MODES.items():
            runs[mode].append(one_start(jobs, args.settle_s))
            print(f"repeat {repeat + 1} {mode}: {runs[mode][-1]}", flush=True)
    medians = {
        mode: {key: statistics.median(r[key] for r in done) for key in done[0]}
        for mode, done in runs.items()
    }
    result = {
        "what": __doc__.split("\n")[0],
        "mlflow": mlflow.__version__,
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "settle_s": args.settle_s,
        "runs": runs,
        "medians": medians,
    }
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(medians, indent=1))


if __name__ == "__main__":
    main()
