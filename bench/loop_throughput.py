"""The worker loop's steady-state throughput on one GPU, for a before/after comparison of two
checkouts in one invocation: each run is a fresh process that imports whichever ``trainforge``
package is first on its Python path (``--baseline DIR`` puts another checkout's there), runs
``trainforge.worker.trainer.run`` on GPU 0 outside Ray (world size 1, no MLflow) and reports the
loop's own ``perf/samples_per_s`` over its last logging window. The rounds alternate the two
packages, so both meet the host in the same state.

- ``cnn``: the synthetic ResNet-18 recipe, CUDA-graphed steps (``precision.cuda_graphs: auto``)
  and eager ones;
- ``sbi``: the two_moons parity recipe (sbi's MAF) at batch 4,096 on 10^6 simulations made once
  by this checkout's stage and given to both packages as finished simulations (the cache
  format is the same).

Usage (GPU machine, repo root):
    python bench/loop_throughput.py --baseline "$PWD/.base" --rounds 3 --out loop.json
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

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "cnn_graphed": ("cnn/synthetic_resnet18_bench.yaml", [
        "train.max_steps=300", "train.log_every_steps=150", "precision.cuda_graphs=auto",
        "workload.synthetic_train_size=80000", "workload.synthetic_val_size=1024"]),
    "cnn_eager": ("cnn/synthetic_resnet18_bench.yaml", [
        "train.max_steps=300", "train.log_every_steps=150", "precision.cuda_graphs=false",
        "workload.synthetic_train_size=80000", "workload.synthetic_val_size=1024"]),
    "sbi_b4096": ("sbi/two_moons_parity.yaml", [
        "workload.simulation.num_simulations=1000000",
        "train.batch_size=4096", "train.epochs=3", "train.log_every_steps=100",
        "train.early_stopping_patience=0", "workload.evaluation.observations=[]",
        "workload.evaluation.sbc_runs=0", "workload.evaluation.c2st=false"]),
}  # fmt: skip
COMMON = ["tracking.enabled=false", "scaling.num_workers=1", "scaling.use_all_gpus=false"]

ONE_RUN = """
import json, sys, tempfile
from pathlib import Path
import torch
from trainforge import config
from trainforge.checkpoint import FolderReporter
from trainforge.distributed import WorkerContext
from trainforge.worker.trainer import run

recipe, overrides = sys.argv[1], json.loads(sys.argv[2])
cfg = config.load(recipe, overrides)
with tempfile.TemporaryDirectory(prefix="tf-loop-") as folder:
    try:
        from trainforge.worker.payload import WorkerPayload
        payload = WorkerPayload(config.to_container(cfg), folder, "bench")
    except ImportError:  # a checkout from before the payload was typed
        payload = {"recipe": config.to_container(cfg), "run_dir": folder}
    reporter = FolderReporter(Path(folder))
    run(payload, WorkerContext(0, 0, 1, 0, torch.device("cuda", 0)), reporter)
print("RESULT", json.dumps({"samples_per_s": reporter.reports[-1]["perf/samples_per_s"],
                            "package": str(Path(config.__file__).parents[1])}))
"""


def one_run(case: str, extra: list[str], pythonpath: str) -> dict[str, Any]:
    recipe, overrides = CASES[case]
    env = {**os.environ, "PYTHONPATH": pythonpath, "OMP_NUM_THREADS": "4"}
    done = subprocess.run(
        [sys.executable, "-c", ONE_RUN, str(ROOT / "recipes" / recipe),
         json.dumps([*COMMON, *overrides, *extra])],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        return {"error": (done.stdout + done.stderr)[-2000:]}
    return json.loads(lines[-1].removeprefix("RESULT "))


def simulations(work: Path) -> str:
    """10^6 two_moons simulations made once by this checkout's stage, on this machine's CPU
    (no Ray: the stage's own process), and their folder."""
    code = (
        "import sys; from trainforge import config; from trainforge.driver.stage import Runner\n"
        "from trainforge.workloads.sbi import simulate\n"
        "cfg = config.load(sys.argv[1], ['workload.simulation.where=here',\n"
        "                                'workload.simulation.num_simulations=1000000']).workload\n"
        "print(simulate.run(cfg, 0, sys.argv[2], Runner(), quiet=True))\n"
    )
    recipe = str(ROOT / "recipes" / CASES["sbi_b4096"][0])
    done = subprocess.run([sys.executable, "-c", code, recipe, str(work)], capture_output=True,
                          text=True, timeout=900, check=True)  # fmt: skip
    return done.stdout.strip().splitlines()[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="a folder holding another checkout's `trainforge`")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    here = os.environ.get("PYTHONPATH", "")
    packages = {"current": here}
    if args.baseline:
        packages["baseline"] = os.pathsep.join(filter(None, [args.baseline, here]))
    cases = args.cases.split(",")
    work = Path(tempfile.mkdtemp(prefix="tf-loop-bench-"))
    extra = {case: [] for case in cases}
    if "sbi_b4096" in cases:
        extra["sbi_b4096"] = [f"workload.simulation.path={simulations(work)}"]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {c: {p: [] for p in packages} for c in cases}
    for index in range(args.rounds):
        order = list(packages) if index % 2 == 0 else list(reversed(packages))
        for case in cases:
            for package in order:
                result = one_run(case, extra[case], packages[package])
                runs[case][package].append(result)
                print(case, package, json.dumps(result)[:300], flush=True)
    medians = {
        case: {package: statistics.median(r["samples_per_s"] for r in results if "samples_per_s"
                                          in r) if any("samples_per_s" in r for r in results)
               else None for package, results in by_package.items()}
        for case, by_package in runs.items()
    }  # fmt: skip
    args.out.write_text(json.dumps({"machine": platform.platform(), "medians": medians,
                                    "runs": runs}, indent=1))  # fmt: skip
    print(json.dumps(medians, indent=1))


if __name__ == "__main__":
    main()
