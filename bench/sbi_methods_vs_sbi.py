"""Each SBI method's debug recipe against sbi 0.27's own trainer of that method, in one
invocation on one machine: wall time, epochs and C2ST at the same observations.

For each method (npe, nle, nre, fmpe, npse) on one task (``--task``, default two_moons):

- the SAME simulations for both sides: one ``trainforge simulate`` entry (``--simulations``,
  default 5,000, made once with ``run.seed=--simulation-seed``), given to sbi as tensors and
  to every command as ``workload.simulation.path``;
- sbi: ``NPE/NLE/NRE/FMPE/NPSE(prior, <network>).append_simulations(θ, x).train(...)``, in this
  process on one thread, with the recipe's network (``posterior_nn`` / ``likelihood_nn`` /
  ``classifier_nn`` / ``posterior_flow_nn`` / ``posterior_score_nn`` with the recipe's
  ``workload.estimator`` keys) and its training settings: the recipe's global batch
  (``train.batch_size`` × ``scaling.num_workers``), lr, patience, gradient clip and epoch cap;
  validated on the rows trainforge validates on (sbi's one ``torch.randperm`` is answered with
  ``run.seed``'s split, ``bench/sbi_baseline.py``). Then ``build_posterior()`` (NLE and NRE: the
  recipe's ``workload.posterior`` MCMC settings) and ``--samples`` (1,000) at each observation;
- trainforge: the whole ``trainforge train recipes/sbi/two_moons_<method>_debug.yaml`` command
  (npe: ``two_moons_debug.yaml``) with ``workload.task``, ``run.seed`` and the simulations'
  path, SBC and the pair plot off (sbi's side makes neither); it samples and scores its own
  posterior;
- the observations are 1..``--observations`` (default 1) of ``--observations-from`` (``own``:
  this project's seeded ones, offline; ``sbibm``: sbibm's stored ones, ``--sbibm-path``); at
  observation k both sides' samples are scored by ``evaluate.scored`` (C2ST) against the
  same reference samples (``Observations.reference(k, samples, seed=run.seed + k)``, C2ST seed
  ``run.seed``: the command's evaluation rule, ``evaluate.scored``), drawn with torch's and
  numpy's seeds at ``run.seed + k`` as the command draws them; the score is the mean over
  the observations.

Times: sbi's ``train()`` wall and its posterior's build + sampling; trainforge's training
("finished at step N in T s", the loop's own), its evaluation ("evaluation done in T s":
sampling + C2ST) and the whole command from the shell (private Ray start, workers, MLflow).

    python bench/sbi_methods_vs_sbi.py --out methods.json [--methods npe nle] [--seeds 3]

``--seeds N`` trains each method at ``run.seed`` / ``torch.manual_seed`` 0..N-1 on the same
simulations (each seed its own split, initialisation and reference samples).

``--device cuda`` races on one GPU: sbi trains there (``device="cuda"``, its prior and data on
the GPU) and each command runs one GPU worker with the recipe's global batch (its step a CUDA
graph where the method allows). With ``--sbi-defaults`` both sides train with sbi's own
``train()`` settings (batch 200, lr 5e-4, patience 20; ``--max-epochs`` caps both), so what
differs is the loop; each command's time to sbi's best validation loss (the arrival of the first
``epoch N done`` line at or below it, from the shell) is set against sbi's ``train()`` wall.

    python bench/sbi_methods_vs_sbi.py --device cuda --sbi-defaults --max-epochs 150 \
        --simulations 10000 --out methods_gpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))
from sbi_race_command import (  # noqa: E402 - bench/ is on the path from here
    EPOCH_DONE,
    command,
    make_simulations,
    simulation_overrides,
    split_permutation,
    work_folder,
)
from startup import stop_cluster  # noqa: E402

METHODS = ("npe", "nle", "nre", "fmpe", "npse")
RECIPES = {m: f"sbi/two_moons_{m}_debug" for m in METHODS} | {"npe": "sbi/two_moons_debug"}
QUIET = ["workload.evaluation.sbc_runs=0", "workload.evaluation.pair_plot=false"]
NUM_SAMPLES = 1000
FINISHED = re.compile(r"finished at step (\d+) in ([\d.]+) s")
EVALUATED = re.compile(r"evaluation done in ([\d.]+) s")
RESTORED = re.compile(r"restored the best weights \(val/loss (-?[\d.]+), epoch (\d+)\)")
C2ST = re.compile(r"c2st/mean\s+([\d.]+)")


def recipe(method: str) -> dict[str, Any]:
    import yaml

    return yaml.safe_load((ROOT.parent / "recipes" / f"{RECIPES[method]}.yaml").read_text())


SBI_VALIDATION_TIMES = 10  # sbi's vector-field trainers' validation_times
SBI_DEFAULTS = {"batch_size": 200, "lr": 5e-4, "early_stopping_patience": 20}  # sbi's train()


def sbi_trainer(method: str, spec: dict[str, Any], prior: Any,
                device: str) -> tuple[Any, dict[str, Any]]:  # fmt: skip
    """sbi's trainer of ``method`` with the recipe's network, and its ``train()`` extras."""
    from sbi import inference, neural_nets

    est = spec["workload"].get("estimator", {})
    kwargs = dict(est.get("model_kwargs", {}))
    common = {"hidden_features": est.get("hidden_features", 50), "z_score_theta": "independent",
              "z_score_x": "independent"}  # fmt: skip
    if method in ("npe", "nle"):
        build = (neural_nets.posterior_nn if method == "npe" else neural_nets.likelihood_nn)(
            model=est.get("model", "maf"), num_transforms=est.get("num_transforms", 5), **common
        )
        made = (inference.NPE if method == "npe" else inference.NLE)(
            prior=prior, density_estimator=build, device=device, show_progress_bars=False
        )
        return made, {}
    if method == "nre":
        atoms = kwargs.pop("num_atoms", 10)
        build = neural_nets.classifier_nn(model=est.get("model", "resnet"), **common, **kwargs)
        made = inference.NRE(prior=prior, classifier=build, device=device,
                             show_progress_bars=False)  # fmt: skip
        return made, {"num_atoms": atoms}
    if method == "fmpe":
        build = neural_nets.posterior_flow_nn(model=est.get("model", "mlp"), **common, **kwargs)
        made = inference.FMPE(prior=prior, vf_estimator=build, device=device,
                              show_progress_bars=False)  # fmt: skip
        return made, {}
    sde = kwargs.pop("sde_type", "ve")
    build = neural_nets.posterior_score_nn(
        model=est.get("model", "mlp"), sde_type=sde, **common, **kwargs
    )
    made = inference.NPSE(prior=prior, vf_estimator=build, sde_type=sde, device=device,
                          show_progress_bars=False)  # fmt: skip
    return made, {}


def train_settings(method: str, args: argparse.Namespace) -> dict[str, Any]:
    """The recipe's training settings both sides use (``--sbi-defaults``: sbi's own)."""
    spec = recipe(method)
    train = spec["train"]
    if args.sbi_defaults:
        train = train | SBI_DEFAULTS | {"batch_size_global": SBI_DEFAULTS["batch_size"]}
    else:
        workers = spec["scaling"]["num_workers"]
        train = train | {"batch_size_global": train["batch_size"] * workers}
    if args.max_epochs:
        train["epochs"] = args.max_epochs
    return train


def sbi_side(method: str, theta: Any, x: Any, seed: int, observed: Any,
             args: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    import numpy as np
    import sbi_baseline
    import torch

    from trainforge.workloads.sbi import evaluate
    from trainforge.workloads.sbi.config import EvaluationSection
    from trainforge.workloads.sbi.tasks import get_task

    spec = recipe(method)
    train = train_settings(method, args)
    device = args.device
    evaluation = EvaluationSection(num_samples=args.samples)  # what `scored` reads of it
    torch.manual_seed(seed)
    prior = get_task(args.task).prior_distribution(device)
    trainer, extra = sbi_trainer(method, spec, prior, device)
    trainer.append_simulations(theta.to(device), x.to(device))
    settings = {
        "training_batch_size": train["batch_size_global"],  # the command's global batch
        "learning_rate": train["lr"],
        "stop_after_epochs": train["early_stopping_patience"],
        "max_num_epochs": train["epochs"] - 1,  # sbi's loop runs epochs 0..max: `epochs` of them
        "clip_max_norm": train["clip_grad_norm"],
        **extra,
    }
    synchronize = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    synchronize()
    started = time.perf_counter()
    with sbi_baseline.validation_split(split_permutation(len(theta), seed)):
        trainer.train(**settings)
    synchronize()
    train_s = time.perf_counter() - started

    sampling = spec["workload"].get("posterior")
    started = time.perf_counter()
    if method in ("nle", "nre"):
        posterior = trainer.build_posterior(
            mcmc_method=sampling.get("mcmc_method", "slice_np_vectorized"),
            mcmc_parameters={"num_chains": sampling["num_chains"],
                             "warmup_steps": sampling["warmup_steps"], "thin": 1},
        )  # fmt: skip
    else:
        posterior = trainer.build_posterior()
    scores, scoring_s = [], 0.0
    for k in range(1, args.observations + 1):
        _, x_obs = observed.observation(k)
        torch.manual_seed(seed + k)
        np.random.seed(seed + k)  # sbi's slice samplers draw from numpy's global RNG
        samples = posterior.sample((args.samples,), x=x_obs.to(device), show_progress_bars=False)
        scoring = time.perf_counter()
        scores.append(evaluate.scored(observed, k, samples.cpu(), evaluation, seed)[0])
        scoring_s += time.perf_counter() - scoring
    sample_s = time.perf_counter() - started - scoring_s
    summary = trainer._summary
    val = [float(v) for v in summary["validation_loss"]]
    return {
        "train_settings": settings,
        "posterior": {"mcmc": sampling} if method in ("nle", "nre") else "build_posterior()",
        "train_wall_s": round(train_s, 2),
        "posterior_and_sampling_s": round(sample_s, 2),
        "c2st_s": round(scoring_s, 2),
        "epochs": len(summary["epoch_durations_sec"]),
        "best_epoch": min(range(len(val)), key=val.__getitem__) + 1,
        "best_val_loss": float(summary["best_validation_loss"][-1]),
        "best_val_loss_per_example": per_example(method, summary, settings, len(theta)),
        "c2st_per_observation": [round(score, 4) for score in scores],
        "c2st": round(sum(scores) / len(scores), 4),
    }


def per_example(method: str, summary: dict[str, Any], settings: dict[str, Any],
                simulations: int) -> float:  # fmt: skip
    """sbi's best validation loss as the mean over examples that trainforge logs: sbi sums
    each batch's losses and divides by batches × batch size. NRE's loss of a batch is already
    its mean (one value), so sbi's NRE number is that mean over the batch size; the vector
    fields' validation repeats each row at sbi's 10 fixed times (``validation_times``), so
    theirs is 10 times the mean over rows of the mean over times, trainforge's rule."""
    best = float(summary["best_validation_loss"][-1])
    if method in ("fmpe", "npse"):
        return best / SBI_VALIDATION_TIMES
    if method != "nre":
        return best
    validation = int(0.1 * simulations)  # sbi's validation_fraction, as trainforge splits
    return best * min(settings["training_batch_size"], validation)


def trainforge_overrides(method: str, args: argparse.Namespace) -> list[str]:
    """The command's overrides beside the simulations: one GPU worker on ``cuda``, and the
    training settings sbi's side uses where they are not the recipe's."""
    train = train_settings(method, args)
    workers = 1 if args.device == "cuda" else recipe(method)["scaling"]["num_workers"]
    device = ["scaling.num_workers=1", "scaling.use_gpu=true"] if args.device == "cuda" else []
    batch = [f"train.batch_size={train['batch_size_global'] // workers}"]
    settings = (
        [f"train.{key}={train[key]}" for key in ("lr", "early_stopping_patience")]
        if args.sbi_defaults else []
    )  # fmt: skip
    capped = [f"train.epochs={args.max_epochs}"] if args.max_epochs else []
    return [*device, *batch, *settings, *capped]


def trainforge_side(method: str, seed: int, located: list[str], env: dict[str, str], work: Path,
                    more: list[str], target: float | None) -> dict[str, Any]:  # fmt: skip
    """The whole command; with ``target`` (sbi's best validation loss), when its epoch lines
    first reach it, from the shell."""
    name = f"{method}_seed{seed}"
    args = ["train", RECIPES[method], f"run.name={name}", *located, f"run.seed={seed}", *QUIET,
            *more]  # fmt: skip
    code, lines = command(args, env, work)
    text = "\n".join(line for _, line in lines)
    finished, evaluated = FINISHED.search(text), EVALUATED.search(text)
    restored, c2st = RESTORED.search(text), C2ST.search(text)
    if code != 0 or not (finished and c2st):
        print("\n".join(line for _, line in lines[-30:]), flush=True)
    reached = next((at for at, line in lines if (m := EPOCH_DONE.search(line))
                    and target is not None and float(m[2]) <= target), None)  # fmt: skip
    return {
        "recipe": f"recipes/{RECIPES[method]}.yaml",
        "overrides": args[3:],
        "exit_code": code,
        "command_wall_s": round(lines[-1][0], 2),
        "train_wall_s": float(finished[2]) if finished else None,
        "evaluation_s": float(evaluated[1]) if evaluated else None,
        "steps": int(finished[1]) if finished else None,
        "epochs": sum(1 for _, line in lines if EPOCH_DONE.search(line)),
        "best_epoch": int(restored[2]) if restored else None,
        "best_val_loss": float(restored[1]) if restored else None,
        "c2st": float(c2st[1]) if c2st else None,
        "time_to_sbi_best_val_loss_s": round(reached, 2) if reached is not None else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--seeds", type=int, default=1, help="training seeds 0..N-1")
    parser.add_argument("--simulations", type=int, default=5000)
    parser.add_argument("--simulation-seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--sbi-defaults", action="store_true",
                        help="both sides train with sbi's train() defaults (batch 200, lr 5e-4, "
                        "patience 20)")  # fmt: skip
    parser.add_argument("--max-epochs", type=int, help="both sides' epoch cap")
    parser.add_argument("--task", default="two_moons")
    parser.add_argument("--observations", type=int, default=1, help="observations 1..N")
    parser.add_argument("--observations-from", choices=("own", "sbibm"), default="own")
    parser.add_argument("--sbibm-path", help="sbibm's wheel or an unpacked one")
    parser.add_argument("--samples", type=int, default=NUM_SAMPLES, help="at each observation")
    args = parser.parse_args()
    args.out = args.out.resolve()  # the bench runs in a folder of its own (os.chdir below)

    import sbi
    import torch

    from trainforge.workloads.sbi import sbibm_data
    from trainforge.workloads.sbi.config import EvaluationSection
    from trainforge.workloads.sbi.observations import Observations
    from trainforge.workloads.sbi.tasks import get_task

    torch.set_num_threads(1)
    sbibm_path = (
        str(sbibm_data.locate(args.sbibm_path)) if args.observations_from == "sbibm" else None
    )
    observed = Observations.of(
        get_task(args.task),
        EvaluationSection(observations_from=args.observations_from, sbibm_path=sbibm_path),
    )
    work, env = work_folder("tf-sbi-methods-")
    sims = [*simulation_overrides(args.simulations, args.simulation_seed),
            f"workload.task={args.task}"]  # fmt: skip
    evaluation = [
        f"workload.evaluation.observations=[{','.join(map(str, range(1, args.observations + 1)))}]",
        f"workload.evaluation.observations_from={args.observations_from}",
        f"workload.evaluation.num_samples={args.samples}",
        *([f"workload.evaluation.sbibm_path={sbibm_path}"] if sbibm_path else []),
    ]
    started = time.perf_counter()
    path, theta, x = make_simulations(sims, env, work)
    report: dict[str, Any] = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0)),
            "python": platform.python_version(),
        },
        "date": time.strftime("%Y-%m-%d"),
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "sbi_defaults": args.sbi_defaults,
        "max_epochs": args.max_epochs,
        "torch": torch.__version__,
        "sbi": sbi.__version__,
        "task": args.task,
        "simulations": args.simulations,
        "simulation_seed": args.simulation_seed,
        "simulations_path": path,
        "same_simulations": True,  # one cache entry: sbi gets its tensors, trainforge its path
        "observations": {"from": observed.label, "numbers": list(range(1, args.observations + 1))},
        "num_samples": args.samples,
        "seeds": args.seeds,
        "threads": {"sbi": 1, "trainforge": f"OMP_NUM_THREADS={env.get('OMP_NUM_THREADS')}"},
        "runs": [],
    }
    try:
        run_all(args, report, theta, x, observed, sims, path, evaluation, env, work, started)
    finally:  # the commands' lasting cluster, started in the bench's own home
        stop_cluster(env)
    print(json.dumps(report, indent=1))


def run_all(args: argparse.Namespace, report: dict[str, Any], theta: Any, x: Any,
            observed: Any, sims: list[str], path: str, evaluation: list[str],
            env: dict[str, str], work: Path, started: float) -> None:  # fmt: skip
    for seed in range(args.seeds):
        for method in args.methods:
            ours = sbi_side(method, theta, x, seed, observed, args)
            print(f"[bench] {method} seed {seed} sbi: {json.dumps(ours)}", flush=True)
            located = [*sims, f"workload.simulation.path={path}", *evaluation]
            more = trainforge_overrides(method, args)
            theirs = trainforge_side(method, seed, located, env, work, more,
                                     ours["best_val_loss_per_example"])  # fmt: skip
            reached = theirs["time_to_sbi_best_val_loss_s"]
            theirs["sbi_train_wall_over_time_to_its_loss"] = (
                round(ours["train_wall_s"] / reached, 2) if reached else None
            )
            print(f"[bench] {method} seed {seed} trainforge: {json.dumps(theirs)}", flush=True)
            report["runs"].append({"method": method, "seed": seed, "sbi": ours,
                                   "trainforge": theirs})  # fmt: skip
            report["total_s"] = round(time.perf_counter() - started, 1)
            args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
