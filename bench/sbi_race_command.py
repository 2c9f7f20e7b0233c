"""Issue 12's CPU race: the whole `trainforge train` command against sbi 0.27's own
`NPE(...).train()`, each to sbi's converged validation loss, in one invocation on one machine.

two_moons, sbi's default estimator (MAF, hidden 50, 5 transforms), the same simulations for
both (one cache entry made by `trainforge simulate`), validated on the same rows (sbi's one
`torch.randperm` call is answered with trainforge's permutation, as in `bench/sbi_speed.py`).

- sbi: its defaults, in this process, one thread; its time is `train()`'s wall time, and its
  best validation loss is the target.
- trainforge: the whole command from the shell, one worker; its time is the arrival of the
  first `epoch N done` line whose val/loss is at or below the target. Measured with the
  lasting local cluster up and its warm workers from an earlier command (`warm`), and as the
  first command after the cluster stopped (`cold`).

    python bench/sbi_race_command.py --out race.json [--simulations 10000] [--repeats 3]

With ``--repeats N`` each variant's cold and warm commands run N times (medians in the JSON's
``medians``); ``--epochs E`` ends each command after E epochs, so more repeats fit a device call.

On a GPU machine (``--device cuda``), sbi trains on the GPU and trainforge's step is a CUDA graph
(the GPU race of issue 12: 20,000 simulations, as in ``bench/sbi_speed.py``).

With ``--seeds N`` it answers another question instead: do the two loops converge to the same
validation loss with sbi's own hyperparameters? For each seed s < N, sbi trains with
``torch.manual_seed(s)`` and trainforge with ``run.seed=s`` (which seeds its split too; sbi is
given that split), and both best validation losses are recorded.

``--seed S`` runs the race on another seed's simulations and split (default 0): the simulations
are made with ``run.seed=S``, sbi trains with ``torch.manual_seed(S)`` on the split that
``run.seed=S`` gives trainforge, and every command gets ``run.seed=S``. A variant tuned on one
seed is checked on others this way.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from sbi_speed import QUIET as SPEED_QUIET  # noqa: E402 - bench/ is on the path from here

RECIPE = "sbi/two_moons_parity"
# sbi_speed's race overrides (no evaluation, no model export), and no observations to fetch
QUIET = [*SPEED_QUIET, "workload.evaluation.observations=[]", "checkpoint.every_epochs=50"]
VARIANTS = {
    "sbi_hyperparameters": [],  # batch 200, lr 5e-4, patience 20: the recipe as shipped
    "b512_lr1e-3": ["train.batch_size=512", "train.lr=1e-3", "train.early_stopping_patience=50"],
    # cosine from 5e-3 to 0 over 350 epochs of batch 1024 (no early stopping)
    "b1024_lr5e-3_cos350": [
        "train.batch_size=1024",
        "train.lr=5e-3",
        "train.schedule=cosine",
        "train.epochs=350",
        "train.early_stopping_patience=0",
    ],
    # shorter cosines (thirty-second session): the fit comes at a schedule's end
    **{
        f"b{batch}_lr{lr}_cos{epochs}": [
            f"train.batch_size={batch}",
            f"train.lr={lr}",
            "train.schedule=cosine",
            f"train.epochs={epochs}",
            "train.early_stopping_patience=0",
        ]
        for batch, lr, epochs in [
            (1024, "5e-3", 250),
            (1024, "5e-3", 200),
            (1024, "1e-2", 250),
            (2048, "1e-2", 300),
            (512, "3e-3", 200),
            (1024, "1e-2", 200),
            (1024, "2e-2", 200),
            (1024, "2e-2", 250),
        ]
    },
}
EPOCH_DONE = re.compile(r"\[trainforge\] epoch (\d+)(?:/\d+)? done: .*val/loss (-?[\d.]+)")


def command(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, list[tuple[float, str]]]:
    """Run a trainforge command; its exit code and each line with its arrival time (s)."""
    started = time.perf_counter()
    process = subprocess.Popen(
        [sys.executable, "-m", "trainforge", *args],
        env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert process.stdout is not None
    lines = [(time.perf_counter() - started, line.rstrip()) for line in process.stdout]
    return process.wait(), [*lines, (time.perf_counter() - started, "<exit>")]


def race(name: str, overrides: list[str], target: float, env: dict[str, str],
         cwd: Path) -> dict[str, Any]:  # fmt: skip
    code, lines = command(["train", RECIPE, f"run.name={name}", *QUIET, *overrides], env, cwd)
    reached = next(
        ((at, int(m[1])) for at, line in lines if (m := EPOCH_DONE.search(line))
         and float(m[2]) <= target),
        None,
    )  # fmt: skip
    losses = [float(m[2]) for _, line in lines if (m := EPOCH_DONE.search(line))]
    result = {
        "name": name,
        "exit_code": code,
        "wall_s": round(lines[-1][0], 2),
        "time_to_target_s": round(reached[0], 2) if reached else None,
        "epoch_at_target": reached[1] if reached else None,
        "epochs": len(losses),
        "best_val_loss": min(losses) if losses else None,
        "first_lines": [f"{at:7.2f} {line}" for at, line in lines[:6]],
        # when each epoch's line arrived: a cold command's extra seconds, at its start or spread
        "epoch_done_at_s": [round(at, 2) for at, line in lines if EPOCH_DONE.search(line)],
    }
    print(f"[bench] {json.dumps(result)}", flush=True)
    return result


def medians(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per variant and mode (``b512_lr1e-3_cold``): the median time to the target and fraction
    of sbi's wall over the repeats, and how many repeats reached the target."""
    by_name: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        by_name.setdefault(re.sub(r"_r\d+$", "", result["name"]), []).append(result)
    summary = {}
    for name, runs in by_name.items():
        reached = [r for r in runs if r["time_to_target_s"] is not None]
        summary[name] = {
            "repeats": len(runs),
            "reached": len(reached),
            "time_to_target_s": statistics.median(r["time_to_target_s"] for r in reached)
            if reached else None,
            "fraction_of_sbi_wall": statistics.median(r["fraction_of_sbi_wall"] for r in reached)
            if reached and reached[0]["fraction_of_sbi_wall"] else None,
        }  # fmt: skip
    return summary


def work_folder(prefix: str) -> tuple[Path, dict[str, str]]:
    """A new folder to work in (this process moves there: sbi writes its TensorBoard logs into
    ./sbi-logs) and the environment of the commands run there: a home of their own, one
    thread, no cluster or warm-worker settings from the caller."""
    work = Path(tempfile.mkdtemp(prefix=prefix))
    os.chdir(work)
    env = {**os.environ, "TRAINFORGE_HOME": str(work / "home"), "OMP_NUM_THREADS": "1"}
    for key in ("RAY_ADDRESS", "TRAINFORGE_KEEP_CLUSTER", "TRAINFORGE_WARM_WORKERS"):
        env.pop(key, None)
    return work, env


def simulation_overrides(simulations: int, seed: int) -> list[str]:
    """The race's simulations: ``simulations`` of two_moons made with ``run.seed=seed``."""
    return [
        f"workload.simulation.num_simulations={simulations}",
        "workload.evaluation.observations_from=own",  # the race scores no observation
        f"run.seed={seed}",
    ]


def make_simulations(sims: list[str], env: dict[str, str], work: Path) -> tuple[str, Any, Any]:
    """``trainforge simulate`` with those overrides: the cache entry's folder, θ and x."""
    from trainforge.workloads.sbi import simulations

    code, lines = command(["simulate", RECIPE, "run.name=sims", *sims], env, work)
    assert code == 0, lines[-5:]
    path = next(line.split("simulations ready: ", 1)[1] for _, line in lines
                if "simulations ready: " in line)  # fmt: skip
    theta, x = simulations.load(Path(path), drop_invalid=False)
    return path, theta, x


def split_permutation(n: int, seed: int) -> Any:
    """The permutation whose tail trainforge validates on with ``run.seed=seed``
    (``workloads.sbi.split``), given to sbi so that both validate on the same rows."""
    import torch

    from trainforge.workloads.sbi.split import split_order

    return torch.cat(split_order(n, 0.1, seed))  # the same permutation at any fraction


def converged_per_seed(seeds: int, theta: Any, x: Any, path: str, sims: list[str],
                       env: dict[str, str], work: Path) -> list[dict[str, Any]]:  # fmt: skip
    """Both trainers with sbi's hyperparameters at each seed, on that seed's split."""
    import sbi_baseline

    results = []
    for seed in range(seeds):
        sbi = sbi_baseline.train_sbi(theta, x, "cpu", seed=seed, max_epochs=None,
                                     split_order=split_permutation(len(theta), seed))  # fmt: skip
        located = [*sims, f"workload.simulation.path={path}", f"run.seed={seed}"]
        ours = race(f"seed{seed}", located, sbi["best_val_loss"], env, work)
        results.append({
            "seed": seed,
            "sbi_best_val_loss": sbi["best_val_loss"], "sbi_epochs": sbi["epochs"],
            "trainforge_best_val_loss": ours["best_val_loss"], "trainforge_epochs": ours["epochs"],
        })  # fmt: skip
        print(f"[bench] seed {seed}: {json.dumps(results[-1])}", flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--simulations", type=int, default=10_000)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS))
    parser.add_argument("--seeds", type=int, default=0, help="the convergence check instead")
    parser.add_argument("--seed", type=int, default=0, help="the simulations' and split's seed")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeats", type=int, default=1, help="cold and warm commands, each")
    parser.add_argument("--epochs", type=int,
                        help="end each command after this many epochs (it must still reach "
                        "the target): shorter commands, so more repeats fit")  # fmt: skip
    parser.add_argument("--target", type=float,
                        help="race to this validation loss (from an earlier sbi run) instead of "
                        "training sbi here: a probe, not a same-invocation comparison")  # fmt: skip
    args = parser.parse_args()
    args.out = args.out.resolve()  # the race runs in a folder of its own (os.chdir below)

    import sbi_baseline
    import torch
    from startup import settle, stop_cluster

    torch.set_num_threads(1)
    work, env = work_folder("tf-sbi-race-")
    sims = simulation_overrides(args.simulations, args.seed)
    graphs = ["precision.cuda_graphs=true"] if args.device == "cuda" else []
    report: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0)),
            "python": platform.python_version(),
        },
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "simulations": args.simulations,
        "seed": args.seed,
        "trainforge": [],
    }

    def save() -> None:
        args.out.write_text(json.dumps(report, indent=1) + "\n")

    path, theta, x = make_simulations(sims, env, work)
    report["simulations_path"] = path
    if args.seeds:
        report["seeds"] = converged_per_seed(args.seeds, theta, x, path, sims, env, work)
        save()
        stop_cluster(env)
        return
    if args.target is None:
        order = split_permutation(len(theta), args.seed)
        sbi = sbi_baseline.train_sbi(theta, x, args.device, seed=args.seed, max_epochs=None,
                                     split_order=order)  # fmt: skip
        sbi.pop("estimator")
    else:
        sbi = {"best_val_loss": args.target, "wall_s": None, "given": True}
    report["sbi"] = sbi
    target = sbi["best_val_loss"]
    save()

    located = [*sims, f"workload.simulation.path={path}"]
    warmup = ["train", RECIPE, "run.name=warmup", *QUIET, *located, "train.epochs=1"]
    capped = [f"train.epochs={args.epochs}"] if args.epochs else []
    for variant, repeat in itertools.product(args.variants, range(args.repeats)):
        overrides = [*located, *VARIANTS[variant], *graphs, *capped]
        stop_cluster(env)
        run = f"_r{repeat}" if repeat else ""  # a new run: the same name would resume and end
        cold = race(f"{variant}_cold{run}", overrides, target, env, work)
        settle(env)  # the cold command's background start of the cluster and its workers
        command(warmup, env, work)  # workers warm, sbi imported (a second time: resumes, ends)
        settle(env)  # the warm command comes later, as a user's next command does
        warm = race(f"{variant}_warm{run}", overrides, target, env, work)
        for result in (cold, warm):
            reached = result["time_to_target_s"]
            fraction = reached / sbi["wall_s"] if reached and sbi["wall_s"] else None
            result["fraction_of_sbi_wall"] = round(fraction, 3) if fraction else None
            result["repeat"] = repeat
            report["trainforge"].append(result)
        report["medians"] = medians(report["trainforge"])
        save()
    stop_cluster(env)
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
