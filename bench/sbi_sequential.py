"""Sequential SBI against the amortized run at the same simulation budget, one observation at
a time: for each number of rounds R (1: the amortized run) and each observation k, one
``trainforge train`` command of the recipe with ``workload.rounds=R`` and ``--total / R``
simulations a round (the rounds' simulation stage and their runs on one Ray head the bench
starts), several at once; each finished run's ``posterior.pt`` (its last round's) scored by C2ST
at its own observation against the reference samples, in a process pool, as
``bench/sbi_accuracy.py`` scores amortized runs (10,000 posterior samples, sbibm's stored
references, classifier seed 1).

A sequential posterior is focused on one observation, so each observation is a run of its own,
as in the sbibm paper's sequential rows; the mean over the observations is the task's score.

Round r0 is the same run at every observation: the first observation's command trains it and
the others keep a copy (``FirstRound``; ``--train-every-first-round`` to train each).

``--sbi R`` adds sbi 0.27's own TSNPE at each observation, in the same invocation: R rounds of
``--total / R`` simulations of the same task's simulator, ``NPE.append_simulations(θ, x)
.train(force_first_round_loss=True)`` with the recipe's flow and training settings (batch,
lr, patience, clip), then ``RestrictedPrior(prior, get_density_thresholder(posterior,
quantile=1e-4), sample_with="rejection")`` as the next proposal (sbi's tutorial's loop, its
defaults); in a process of the pool on one thread, scored as the commands are.

Usage (repo root):
    python bench/sbi_sequential.py --task slcp --rounds 1 5 --total 100000 \
        --observations 1 2 3 4 --out sbi_sequential.json [more overrides]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from sbi_accuracy import c2st_job, sbibm_location, start_ray, usable_cpus  # noqa: E402

RAY_WORKER_NICENESS = 15  # what Ray's worker processes run at


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--recipe", default=str(ROOT / "recipes" / "sbi" / "npe_1e5.yaml"))
    parser.add_argument("--task", default="slcp")
    parser.add_argument("--rounds", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--total", type=int, default=100_000, help="simulations, all rounds")
    parser.add_argument("--observations", type=int, nargs="+", default=[1])
    parser.add_argument("--observations-from", choices=("sbibm", "own"), default="sbibm")
    parser.add_argument("--sbibm-path", default=None)
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--concurrent-runs", type=int, default=4)
    parser.add_argument("--gpu-share", type=float, default=0.25, help="GPU fraction per run")
    parser.add_argument("--c2st-workers", type=int, default=4)
    parser.add_argument("--deadline-s", type=float, default=540)
    parser.add_argument("--sbi", type=int, default=0, help="rounds of sbi's own TSNPE (0: none)")
    parser.add_argument(
        "--train-every-first-round", dest="share_first_round", action="store_false",
        help="each observation's command trains round r0 itself (default: the first "
             "observation's r0 is copied to the others: the same run)",
    )  # fmt: skip
    parser.add_argument(
        "--work", type=Path, default=None,
        help="the runs' folder (default: a new temporary one); the bench run again on the "
             "same folder resumes the runs its deadline cut",
    )  # fmt: skip
    parser.add_argument("overrides", nargs="*", help="more recipe overrides")
    args = parser.parse_args()
    args.recipe = str(Path(args.recipe).resolve())
    sbibm_path = sbibm_location(args)
    deadline = time.monotonic() + args.deadline_s

    import torch

    gpus = torch.cuda.device_count()
    work = args.work.resolve() if args.work else Path(tempfile.mkdtemp(prefix="sbi-sequential-"))
    work.mkdir(parents=True, exist_ok=True)
    head, env = start_ray(head_cpus=max(args.concurrent_runs + 1, usable_cpus()), gpus=gpus)
    # stopped below whatever happens: a `ray start --block` left behind holds the bench's ports
    scaling = (
        ["scaling.use_gpu=true", f"scaling.resources_per_worker={{GPU: {args.gpu_share}, CPU: 1}}",
         "workload.simulation.device=cpu"]  # a GPU chunk task would wait for a whole GPU
        if gpus else ["scaling.use_gpu=false"]
    )  # fmt: skip
    source = [f"workload.evaluation.observations_from={args.observations_from}"]
    if sbibm_path:
        source.append(f"workload.evaluation.sbibm_path={sbibm_path}")
    common = [
        f"workload.task={args.task}", f"run.storage_path={work / 'runs'}",
        "tracking.enabled=false", "workload.evaluation.c2st=false",
        "workload.evaluation.pair_plot=false", "workload.evaluation.sbc_runs=0",
        *source, *scaling, *args.overrides,
    ]  # fmt: skip
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(0) if gpus else None,
        "usable_cpus": usable_cpus(),
        "recipe": str(Path(args.recipe).relative_to(ROOT)),
        "task": args.task, "rounds": args.rounds, "simulations_total": args.total,
        "overrides": common,
        "observations_from": args.observations_from, "samples": args.samples,
        "c2st": "trainforge.workloads.sbi.c2st (sbi c2st, sbibm MLP settings, float32), seed 1",
        "runs": {},
    }  # fmt: skip

    def save() -> None:
        args.out.write_text(json.dumps(report, indent=2) + "\n")

    try:
        run_all(args, work, env, common, report, sbibm_path, deadline, save)
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # the head's own session: it and its node
        head.wait(timeout=60)
    save()
    print(json.dumps({k: v.get("c2st") for k, v in report["runs"].items()}
                     | {"mean": report["c2st_mean"]}, indent=2))  # fmt: skip


def run_all(args: argparse.Namespace, work: Path, env: dict[str, str], common: list[str],
            report: dict[str, Any], sbibm_path: str | None, deadline: float,
            save: Any) -> None:  # fmt: skip
    """Every (rounds, observation) command, ``args.concurrent_runs`` at a time, each scored as
    it ends; what the deadline cut is reported as such."""
    # the sides interleaved by observation: a bench stopped early has both at the first ones
    queue = [(r, k) for k in args.observations for r in args.rounds]
    running: dict[str, tuple[subprocess.Popen, Any, float]] = {}
    # at the niceness Ray gives its workers (15): a scoring process at 0 starved the commands'
    # workers on 2 cores (a step 45× slower)
    pool = ProcessPoolExecutor(max_workers=args.c2st_workers, initializer=os.nice,
                               initargs=(RAY_WORKER_NICENESS,))  # fmt: skip
    scores: dict[str, Any] = {}
    if args.sbi:  # sbi's side: its own loop per observation, in the pool from the start
        import yaml

        spec = yaml.safe_load(Path(args.recipe).read_text())
        for k in args.observations:
            name = f"{args.task}_sbi_r{args.sbi}_obs{k}"
            report["runs"][name] = {"side": "sbi TSNPE"}
            scores[name] = pool.submit(sbi_tsnpe_job, args.task, k, args.sbi, args.total, spec,
                                       args.samples, args.observations_from, sbibm_path,
                                       work)  # fmt: skip
    first = FirstRound(args, work)
    while (queue or running) and time.monotonic() < deadline:
        first.share(running, queue)
        while len(running) < args.concurrent_runs:
            ready = [item for item in queue if first.ready(*item)]
            if not ready:
                break
            rounds, k = ready[0]
            queue.remove((rounds, k))
            name = f"{args.task}_r{rounds}_obs{k}"
            log = open(work / f"{name}.log", "w")  # noqa: SIM115 - closed when done
            command = [sys.executable, "-m", "trainforge", "train", args.recipe, *common,
                       f"run.name={name}", f"workload.rounds={rounds}",
                       f"workload.simulation.num_simulations={args.total // rounds}",
                       f"workload.evaluation.observations=[{k}]"]  # fmt: skip
            running[name] = (subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                              env=env), log, time.monotonic())  # fmt: skip
        time.sleep(2)
        for name, (process, log, started) in list(running.items()):
            if process.poll() is None:
                continue
            log.close()
            del running[name]
            said = (work / f"{name}.log").read_text()
            entry = {"exit_code": process.returncode, "wall_s": time.monotonic() - started,
                     "rounds_said": [line for line in said.splitlines()
                                     if "sequential:" in line or "finished at step" in line],
                     "log_tail": said[-2000:]}  # fmt: skip
            report["runs"][name] = entry
            print(f"[bench] {name}: exit {process.returncode}, {entry['wall_s']:.0f} s",
                  flush=True)  # fmt: skip
            posterior = work / "runs" / name / "posterior.pt"
            k = int(name.rpartition("obs")[2])
            if process.returncode == 0 and posterior.is_file():
                scores[name] = pool.submit(
                    c2st_job,
                    [str(posterior)],
                    args.task,
                    k,
                    args.samples,
                    args.observations_from,
                    sbibm_path,
                )
            save()
    for name, (process, log, started) in running.items():  # past the deadline
        process.kill()
        log.close()
        report["runs"][name] = {
            "exit_code": None, "killed_after_s": time.monotonic() - started,
            "log_tail": (work / f"{name}.log").read_text()[-2000:],
        }  # fmt: skip
    for name, future in scores.items():
        try:
            wait = max(5.0, deadline + 60 - time.monotonic())
            report["runs"][name] |= future.result(timeout=wait)
        except Exception as exc:  # a C2ST that did not finish in time is reported as such
            report["runs"][name]["error"] = repr(exc)
        save()
    pool.shutdown(wait=False, cancel_futures=True)
    report["c2st_mean"] = {}
    sides = {str(r): f"{args.task}_r{r}_" for r in args.rounds}
    if args.sbi:
        sides[f"sbi_{args.sbi}"] = f"{args.task}_sbi_r{args.sbi}_"
    for side, prefix in sides.items():
        done = [r["c2st"] for name, r in report["runs"].items()
                if name.startswith(prefix) and "c2st" in r]  # fmt: skip
        report["c2st_mean"][side] = {
            "mean": sum(done) / len(done) if done else None,
            "observations": len(done),
        }


class FirstRound:
    """Round r0 is the same run at every observation (the prior's simulations, the same seed;
    the observation only says where later rounds focus): the first observation's command
    trains it, and once that command has gone on to r1, its r0 folder is copied into the other
    observations' runs, which keep it as a finished round (``rounds_run``: a round whose
    posterior is on disk is kept). Their commands start then. ``--train-every-first-round``
    turns this off."""

    def __init__(self, args: argparse.Namespace, work: Path) -> None:
        self.args, self.work = args, work
        self.lead = args.observations[0]
        self.pending = {r for r in args.rounds if r > 1} if args.share_first_round else set()

    def name(self, rounds: int, k: int) -> str:
        return f"{self.args.task}_r{rounds}_obs{k}"

    def ready(self, rounds: int, k: int) -> bool:
        return rounds not in self.pending or k == self.lead

    def share(self, running: dict[str, Any], queue: list[tuple[int, int]]) -> None:
        for rounds in list(self.pending):
            lead = self.name(rounds, self.lead)
            log = self.work / f"{lead}.log"
            moved_on = log.is_file() and "sequential: round r1: drawing" in log.read_text()
            if not moved_on and (lead in running or (rounds, self.lead) in queue):
                continue  # not started, or still in r0
            source = self.work / "runs" / lead / "rounds" / f"{lead}-r0"
            for k in self.args.observations[1:]:
                name = self.name(rounds, k)
                target = self.work / "runs" / name / "rounds" / f"{name}-r0"
                if moved_on and not target.exists():
                    shutil.copytree(source, target)
            self.pending.discard(rounds)  # (a lead that failed first: each trains its own)


def sbi_tsnpe_job(task: str, observation: int, rounds: int, total: int, spec: dict[str, Any],
                  n: int, source: str, sbibm_path: str | None,
                  work: Path) -> dict[str, Any]:  # fmt: skip
    """sbi's own TSNPE at one observation (see the module's text), scored by C2ST; in the
    bench's work folder, where sbi's trainer writes its ``sbi-logs``."""
    os.chdir(work)
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    from sbi import inference, neural_nets
    from sbi.utils import RestrictedPrior, get_density_thresholder

    from trainforge.workloads.sbi.c2st import c2st
    from trainforge.workloads.sbi.config import EvaluationSection
    from trainforge.workloads.sbi.observations import Observations
    from trainforge.workloads.sbi.tasks import get_task

    torch.set_num_threads(1)
    torch.manual_seed(observation)
    simulator = get_task(task)
    prior = simulator.prior_distribution("cpu")
    observed = Observations.of(simulator, EvaluationSection(observations_from=source,
                                                            sbibm_path=sbibm_path))  # fmt: skip
    _, x_obs = observed.observation(observation)
    est, train = spec["workload"].get("estimator", {}), spec["train"]
    build = neural_nets.posterior_nn(model=est.get("model", "maf"),
                                     hidden_features=est.get("hidden_features", 50),
                                     num_transforms=est.get("num_transforms", 5))  # fmt: skip
    npe = inference.NPE(prior=prior, density_estimator=build, show_progress_bars=False)
    started = time.perf_counter()
    proposal, kept = prior, []
    for round_ in range(rounds):
        theta = proposal.sample((total // rounds,))
        npe.append_simulations(theta, simulator.simulate(theta))
        npe.train(training_batch_size=train["batch_size"], learning_rate=train["lr"],
                  stop_after_epochs=train["early_stopping_patience"],
                  clip_max_norm=train["clip_grad_norm"], force_first_round_loss=True)  # fmt: skip
        posterior = npe.build_posterior().set_default_x(x_obs)
        if round_ < rounds - 1:
            truncated = RestrictedPrior(prior, get_density_thresholder(posterior, quantile=1e-4),
                                        sample_with="rejection")  # fmt: skip
            truncated.sample((1000,), save_acceptance_rate=True, print_rejected_frac=False)
            kept.append(float(truncated.acceptance_rate))
            proposal = truncated
    train_s = time.perf_counter() - started
    samples = posterior.sample((n,), show_progress_bars=False)
    reference = observed.reference(observation, n, seed=observation)
    return {"observation": observation, "c2st": c2st(reference, samples[: len(reference)], seed=1),
            "wall_s": train_s, "prior_kept": kept}  # fmt: skip


if __name__ == "__main__":
    main()
