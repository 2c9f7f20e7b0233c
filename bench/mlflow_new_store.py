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


def measure(uri: str, seeded: bool, env: dict[str, str]) -> tuple[float, float]:
    done = subprocess.run([sys.executable, "-c", MEASURE, uri, "1" if seeded else "0"],
                          env=env, capture_output=True, text=True, check=True)  # fmt: skip
    cpu, wall = done.stdout.split()
    return float(cpu), float(wall)


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
    medians = {
        kind: {"cpu_s": round(statistics.median(c for c, _ in values), 3),
               "wall_s": round(statistics.median(w for _, w in values), 3)}
        for kind, values in runs.items()
    }  # fmt: skip
    import mlflow

    report = {
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "mlflow": mlflow.__version__},
        "repeats": args.repeats, "runs": runs, "medians": medians,
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(report, indent=2))
    for kind, values in medians.items():
        print(kind, values)


if __name__ == "__main__":
    main()
