"""What logging the final model costs a run's end in a new process (as a cold command's rank 0
is): ``model_logging.log`` of the CNN recipes' ResNet-18 (MLflow's pytorch flavour), with
MLflow's scan of every installed package (as MLflow does it) against without it
(``no_package_scan``: our requirements are named, so the scan finds nothing the check needs).

Each measurement is a new Python process that imports torch, MLflow and the loop's modules and
creates the run, untimed, then times, in CPU and wall seconds, the model's logging: MLflow's
first-time imports and checks in that process included. The two kinds alternate in each repeat.

    python bench/model_logging.py --repeats 5 --out results.json
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

from mlflow_new_store import timed_process, write_report  # this folder's bench of the store

MEASURE = """
import contextlib, sys, time
import torch
import mlflow
from mlflow.tracking import MlflowClient
import trainforge.worker.trainer  # noqa: F401 - what rank 0 has imported by its end
from trainforge.tracking import model_logging
from trainforge.tracking.client import RunHandle
from trainforge.workloads.cnn.models import build_model
uri, scan = sys.argv[1], sys.argv[2] == "1"
client = MlflowClient(tracking_uri=uri)
known = client.get_experiment_by_name("bench")
run = client.create_run(known.experiment_id if known else client.create_experiment("bench"))
handle = RunHandle(uri, "bench", "bench", run.info.run_id, False, sys.argv[3])
model, example = build_model("resnet18_cifar", 3, 10, 32), torch.randn(2, 3, 32, 32)
if scan:  # as MLflow does it: the scan left in
    model_logging.no_package_scan = contextlib.nullcontext
cpu, wall = time.process_time(), time.perf_counter()
record = model_logging.ModelRecord("resnet18_cifar")
assert model_logging.log(handle, *model_logging.for_mlflow(model, example), record=record)
print(time.process_time() - cpu, time.perf_counter() - wall)
"""

KINDS = ("mlflow_scans_packages", "no_package_scan")


def measure(uri: str, scan: bool, spool: Path, env: dict[str, str]) -> tuple[float, float]:
    return timed_process(MEASURE, [uri, "1" if scan else "0", str(spool)], env)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="model_logging.json")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-model-logging-"))
    env = {**os.environ, "TRAINFORGE_HOME": str(work / "home"), "OMP_NUM_THREADS": "1",
           "MLFLOW_DISABLE_TELEMETRY": "true"}  # fmt: skip
    uri, spool = f"sqlite:///{work / 'mlflow.db'}", work / "spool.jsonl"
    measure(uri, True, spool, env)  # the store made and the files read once, not counted
    runs: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
    for repeat in range(args.repeats):
        order = KINDS if repeat % 2 == 0 else KINDS[::-1]  # neither always goes first
        for kind in order:
            runs[kind].append(measure(uri, kind == "mlflow_scans_packages", spool, env))
        print(repeat, {kind: values[-1] for kind, values in runs.items()}, flush=True)
    import mlflow
    import torch

    write_report(args.out, args.repeats, runs, mlflow=mlflow.__version__, torch=torch.__version__)


if __name__ == "__main__":
    main()
