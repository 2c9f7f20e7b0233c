"""What a new SQLite MLflow store costs the command that makes it: MLflow's own creation (its
tables and every schema migration) against a copy of trainforge's empty store
(``tracking/new_store.py``), and an existing store opened, for comparison.

Each measurement is a new Python process (as a command is) that imports MLflow first, untimed,
then times, in CPU seconds and wall seconds, what a command does next: the store made or opened
and a run created in it. The three kinds alternate within each repeat.

    python bench/mlflow_new_store.py --repeats 5 --out results.json
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
from pathlib import Path
from typing import Any

MEASURE = """
import sys, time
import mlflow
from mlflow.tracking import MlflowClient
from trainforge.tracking import new_store
uri, seeded = sys.argv[1], sys.argv[2] == "1"
cpu, wall = time.process_time(), time.perf_counter()
if seeded:
    new_store.seed(uri)
client = MlflowClient(tracking_uri=uri)
client.create_run(client.create_experiment(f"e{time.time_ns()}"))
print(time.process_time() - cpu, time.perf_counter() - wall)
"""

KINDS = ("mlflow_creates", "trainforge_copy", "existing")


def timed_process(code: str, args: list[str], env: dict[str, str]) -> tuple[float, float]:
    """Run ``code`` in a new Python process; it prints its CPU and wall seconds last."""
    done = subprocess.run([sys.executable, "-c", code, *args],
                          env=env, capture_output=True, text=True, check=True)  # fmt: skip
    cpu, wall = done.stdout.split()[-2:]
    return float(cpu), float(wall)


def measure(uri: str, seeded: bool, env: dict[str, str]) -> tuple[float, float]:
    return timed_process(MEASURE, [uri, "1" if seeded else "0"], env)


def write_report(out: str, repeats: int, runs: dict[str, list[tuple[float, float]]],
                 **machine: Any) -> None:  # fmt: skip
    """Each kind's CPU and wall medians, and every run, as JSON in ``out``; the medians printed.
    ``machine`` adds to the platform facts (package versions)."""
    medians = {
        kind: {"cpu_s": round(statistics.median(c for c, _ in values), 3),
               "wall_s": round(statistics.median(w for _, w in values), 3)}
        for kind, values in runs.items()
    }  # fmt: skip
    report = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "usable_cpus": len(os.sched_getaffinity(0)),
                    "python": platform.python_version(), **machine},
        "repeats": repeats, "runs": runs, "medians": medians,
    }  # fmt: skip
    Path(out).write_text(json.dumps(report, indent=2))
    for kind, values in medians.items():
        print(kind, values)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="mlflow_new_store.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-new-store-"))
    env = {**os.environ, "TRAINFORGE_HOME": str(work / "home"), "OMP_NUM_THREADS": "1"}
    measure(f"sqlite:///{work / 'template_made.db'}", True, env)  # the template, made once
    existing = f"sqlite:///{work / 'existing.db'}"
    measure(existing, False, env)
    runs: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
    for repeat in range(args.repeats):
        runs["mlflow_creates"].append(measure(f"sqlite:///{work / f'm{repeat}.db'}", False, env))
        runs["trainforge_copy"].append(measure(f"sqlite:///{work / f't{repeat}.db'}", True, env))
        runs["existing"].append(measure(existing, False, env))
        print(repeat, {kind: values[-1] for kind, values in runs.items()}, flush=True)
    import mlflow

    write_report(args.out, args.repeats, runs, mlflow=mlflow.__version__)


if __name__ == "__main__":
    main()
