"""SBI training speed: trainforge against sbi 0.27's own ``NPE(...).train()``, same GPU, one run.

Two questions, both on two_moons with sbi's default estimator (MAF, hidden 50, 5 transforms):

1. Throughput (samples/s). sbi: ``train()`` with its defaults on 100k simulations, two epochs
   (its per-epoch timer covers the training and validation passes). trainforge: the recipe
   ``recipes/sbi/two_moons_parity.yaml`` (same estimator) through Ray Train on one GPU, on 10^6
   simulations, at several batch sizes, eager and compiled; the figure is the loop's own
   steady-state ``perf/samples_per_s`` over the last logging window.
2. Time to sbi's converged validation loss. sbi trains to its early stop on 20k simulations;
   its best validation loss is the target. trainforge trains on the *same* simulations (the
   cache entry the simulation stage made, handed to sbi) with large batches; its time is the
   loop's elapsed time (``perf/elapsed_s``) at the first epoch whose val/loss is at or below the
   target. sbi's time is its ``train()`` wall time (what its user waits for) and, for
   reference, its time to its own best epoch. Both trainers validate on the same 10% split
   (2,000 rows: sbi's one ``torch.randperm`` call is answered with trainforge's permutation);
   both final estimators are also scored on one common fresh test set of 100k simulations.

Usage (GPU machine, repo root):  python bench/sbi_speed.py --out sbi_speed.json
    [--race-only] [--race-runs race_b512_lr1e-3_patience50_graphs]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

PARITY = ROOT / "recipes" / "sbi" / "two_moons_parity.yaml"
QUIET = [
    "tracking.system_metrics=false",
    "tracking.log_model=false",
    "workload.evaluation.c2st=false",
    "workload.evaluation.sbc_runs=0",
    "workload.evaluation.pair_plot=false",
]


def trainforge_run(name: str, storage: Path, overrides: list[str]) -> dict[str, Any]:
    from mlflow.tracking import MlflowClient
    from recipe_run import train_recipe

    cfg, outcome, result = train_recipe(PARITY, name, storage, [*QUIET, *overrides])
    result["overrides"] = overrides
    resolved = outcome.recipe or cfg  # the driver fills in where the simulations are
    result["simulations"] = resolved.workload.simulation.path
    result["run_dir"] = str(storage / name)
    if outcome.mlflow_run_id:
        client = MlflowClient()
        history = {
            key: {m.step: m.value for m in client.get_metric_history(outcome.mlflow_run_id, key)}
            for key in ("val/loss", "perf/elapsed_s")
        }
        steps = sorted(set(history["val/loss"]) & set(history["perf/elapsed_s"]))
        result["curve"] = [
            (step, history["perf/elapsed_s"][step], history["val/loss"][step]) for step in steps
        ]
    print(f"[bench] {name}: {json.dumps({k: v for k, v in result.items() if k != 'curve'})}")
    return result


def time_to_target(curve: list[tuple[int, float, float]], target: float) -> float | None:
    for _, elapsed, val_loss in curve:
        if val_loss <= target:
            return elapsed
    return None


def test_loss(estimator: torch.nn.Module, theta: torch.Tensor, x: torch.Tensor) -> float:
    estimator = estimator.eval().to("cuda")
    with torch.no_grad():
        losses = [
            estimator.loss(t.cuda(), condition=c.cuda()).mean().item()
            for t, c in zip(theta.split(10_000), x.split(10_000), strict=True)
        ]
    return sum(losses) / len(losses)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--race-simulations", type=int, default=20_000)
    parser.add_argument("--deadline-s", type=float, default=540, help="skip what would run later")
    parser.add_argument("--race-only", action="store_true", help="skip the throughput part")
    parser.add_argument("--race-runs", nargs="+", help="only these trainforge race runs, by name")
    args = parser.parse_args()
    deadline = time.monotonic() + args.deadline_s
    os.environ.setdefault("OMP_NUM_THREADS", "4")
    work = Path(tempfile.mkdtemp(prefix="sbi-speed-"))
    os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{work}/mlflow.db"
    storage = work / "runs"

    import sbi_baseline

    from trainforge.workloads.sbi import export, simulations
    from trainforge.workloads.sbi.tasks import get_task

    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(0),
        "host_cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "throughput": [],
        "race": {},
    }

    def save() -> None:
        args.out.write_text(json.dumps(report, indent=2) + "\n")

    # -- 2. time to sbi's converged validation loss (same simulations for both) ---------------
    race_n = args.race_simulations
    graphs = "precision.cuda_graphs=true"
    runs = [
        ("race_parity_graphs", [graphs]),  # sbi's own hyperparameters, batch 200
        (
            "race_b512_lr1e-3_patience50_graphs",
            ["train.batch_size=512", "train.lr=1e-3", "train.early_stopping_patience=50", graphs],
        ),
    ]
    if args.race_runs:
        runs = [(name, overrides) for name, overrides in runs if name in args.race_runs]
    race: dict[str, Any] = {"simulations": race_n, "trainforge": []}
    for name, overrides in runs:
        result = trainforge_run(
            name,
            storage,
            [
                f"workload.simulation.num_simulations={race_n}",
                "train.log_every_steps=100000",
                "checkpoint.every_epochs=50",
                *overrides,
            ],
        )
        race["trainforge"].append(result)
        report["race"] = race
        save()
    theta, x = simulations.load(Path(race["trainforge"][0]["simulations"]), drop_invalid=False)
    # the same validation rows for sbi as for trainforge (run.seed 0 → split seed 0)
    order = torch.randperm(len(theta), generator=torch.Generator().manual_seed(0))
    sbi = sbi_baseline.train_sbi(theta, x, "cuda", seed=0, max_epochs=None, split_order=order)
    sbi_estimator = sbi.pop("estimator")
    race["sbi"] = sbi
    target = sbi["best_val_loss"]
    generator = torch.Generator().manual_seed(12345)
    task = get_task("two_moons")
    test_theta = task.prior_sample(100_000, generator)
    test_x = task.simulate(test_theta, generator)
    race["sbi"]["test_loss"] = test_loss(sbi_estimator, test_theta, test_x)
    for result in race["trainforge"]:
        reached = time_to_target(result.get("curve", []), target)
        result["time_to_sbi_best_s"] = reached
        result["speedup_vs_sbi_wall"] = sbi["wall_s"] / reached if reached else None
        result["speedup_vs_sbi_time_to_best"] = sbi["time_to_best_s"] / reached if reached else None
        estimator, _ = export.load_estimator(Path(result["run_dir"]) / "posterior.pt")
        result["test_loss"] = test_loss(estimator, test_theta, test_x)
    save()

    if args.race_only:
        return
    # -- 1. throughput --------------------------------------------------------------------
    big_theta, big_x = sbi_baseline.simulate_two_moons(100_000, seed=0)
    base = sbi_baseline.train_sbi(big_theta, big_x, device="cuda", seed=0, max_epochs=1)
    base.pop("estimator")
    report["sbi_throughput"] = base
    save()
    variants = [
        ("tp_b200_graphs", ["train.batch_size=200", graphs]),
        ("tp_b4096_graphs", ["train.batch_size=4096", graphs]),
        ("tp_b16384_graphs", ["train.batch_size=16384", graphs]),
        ("tp_b200", ["train.batch_size=200"]),
        ("tp_b16384", ["train.batch_size=16384"]),
    ]
    for name, overrides in variants:
        if time.monotonic() > deadline:
            report["throughput"].append({"name": name, "skipped": "deadline"})
            continue
        result = trainforge_run(
            name,
            storage,
            [
                "workload.simulation.num_simulations=1000000",
                "workload.simulation.chunk_size=1000000",
                "train.max_steps=400",
                "train.log_every_steps=100",
                "train.early_stopping_patience=0",
                *overrides,
            ],
        )
        result["speedup_vs_sbi"] = (result["samples_per_s"] or 0) / base["samples_per_s"]
        report["throughput"].append(result)
        save()
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
