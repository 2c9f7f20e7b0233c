"""SBI accuracy table: C2ST of NPE at observations 1-10 of each benchmark task, at each
simulation budget, with the recipes in recipes/sbi/ as they are.

By default the posteriors are scored at sbibm's own ten stored observations per task against
its stored 10,000 reference posterior samples (read from the sbibm 1.1.0 wheel through
``trainforge.workloads.sbi.observations``), the ones the sbibm paper's C2ST values use, so each
cell compares with the paper's NPE value (``SBIBM_NPE``; the paper stops at 10^5 simulations;
for gaussian_mixture also the rerun on sbibm 1.1.0, ``SBIBM_NPE_RERUN``).
``--observations-from own`` scores at this project's seeded observations and reference
samplers instead (offline). The wheel is found as a run finds it: ``--sbibm-path``, else
``$TRAINFORGE_SBIBM``, else the cache, else PyPI once; the bench resolves it before anything
starts and hands the same path to every run and every scoring process.

Each recipe runs through ``trainforge train`` against one Ray head the bench starts for itself
(``ray start --head --block`` on fixed local ports; stopped by the bench, never ``ray stop``),
several runs at once with a fraction of a GPU each where there are GPUs (the estimators are
small and launch-bound, so a GPU serves several runs), on CPU (``scaling.use_gpu=false``)
where there are none. C2ST is the workload's own (``trainforge.workloads.sbi.c2st``: sbi's
c2st with sbibm's MLP settings, in float32), computed in a process pool on the host's cores as
soon as a run's ``posterior.pt`` exists: per observation k, 10,000 samples of the exported
``DirectPosterior`` (what an sbi user loads; torch seed k) against 10,000 reference samples
(sbibm stores exactly 10,000; a random subset, seed k, when fewer are asked for), classifier
seed 1. The JSON is rewritten as each run ends and each task's scores come in, so a bench
stopped early leaves what it had.

Usage (repo root):
    python bench/sbi_accuracy.py --budgets 1e4 1e5 1e6 --out sbi_accuracy.json
    python bench/sbi_accuracy.py --score POSTERIORS/ --out scores.json  # <task>_<budget>.pt
    python bench/sbi_accuracy.py --score POSTERIORS/ --ensembles --out scores.json
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
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# the `ray` command, also where only the package is on PYTHONPATH (the GPU machines' bundle)
RAY = [sys.executable, "-m", "ray.scripts.scripts"]
TASKS = ("two_moons", "gaussian_linear", "gaussian_mixture", "slcp", "bernoulli_glm")
# sbibm paper (Lueckmann et al. 2021), NPE row, C2ST at 10^4 and 10^5 simulations (the paper's
# budgets are 10^3-10^5: a 10^6 cell has no paper value)
SBIBM_NPE = {
    "two_moons": {"1e4": 0.61, "1e5": 0.54},
    "gaussian_linear": {"1e4": 0.55, "1e5": 0.51},
    "gaussian_mixture": {"1e4": 0.66, "1e5": 0.56},
    "slcp": {"1e4": 0.90, "1e5": 0.83},
    "bernoulli_glm": {"1e4": 0.68, "1e5": 0.56},
}
# sbibm 1.1.0 fixed gaussian_mixture's batched simulator (sbibm PR 63), which the paper's runs
# trained on; its authors' rerun of NPE on the fixed task (sbi-benchmark/results,
# gaussian_mixture_rerun) scores lower, and is the value to compare with here
SBIBM_NPE_RERUN = {"gaussian_mixture": {"1e4": 0.615, "1e5": 0.548}}


def c2st_job(
    posterior_files: list[str],
    task: str,
    observation: int,
    n: int,
    source: str,
    sbibm_path: str | None,
) -> dict[str, Any]:
    """C2ST of one posterior at one observation, in a pool process of one thread. Several
    files are one ensemble: the equal-weight mixture of their posteriors (n / K samples each,
    as sbi's ``NeuralPosteriorEnsemble`` with uniform weights draws)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    from trainforge.workloads.sbi import load_posterior
    from trainforge.workloads.sbi.c2st import c2st
    from trainforge.workloads.sbi.config import EvaluationSection
    from trainforge.workloads.sbi.observations import Observations
    from trainforge.workloads.sbi.tasks import get_task

    torch.set_num_threads(1)
    started = time.perf_counter()
    # source: "sbibm" or "own" (argparse choices; the section checks it again)
    evaluation = EvaluationSection(observations_from=source, sbibm_path=sbibm_path)
    observed = Observations.of(get_task(task), evaluation)
    _, x_obs = observed.observation(observation)
    torch.manual_seed(observation)
    shares = [n // len(posterior_files) + (i < n % len(posterior_files))
              for i in range(len(posterior_files))]  # fmt: skip
    samples = torch.cat([
        load_posterior(file).sample((share,), x=x_obs, show_progress_bars=False)
        for file, share in zip(posterior_files, shares, strict=True)
    ])  # fmt: skip
    reference = observed.reference(observation, n, seed=observation)
    sampled = time.perf_counter()
    # equal counts on both sides (sbibm stores 10,000), so that chance scores 0.5
    score = c2st(reference, samples[: len(reference)], seed=1)
    return {
        "observation": observation,
        "c2st": score,
        "samples": len(reference),
        "sample_s": sampled - started,
        "c2st_s": time.perf_counter() - sampled,
    }


def submit_scores(
    pool: ProcessPoolExecutor,
    posteriors: list[Path],
    task: str,
    args: argparse.Namespace,
    sbibm_path: str | None,
) -> list[Future]:
    """One C2ST job per observation 1..``args.observations``."""
    source, files = args.observations_from, [str(p) for p in posteriors]
    return [
        pool.submit(c2st_job, files, task, k, args.samples, source, sbibm_path)
        for k in range(1, args.observations + 1)
    ]


def scored(task: str, budget: str, results: list[dict[str, Any]]) -> dict[str, Any]:
    """A run's C2ST entries: per observation, the mean over those that finished, the paper's."""
    done = [r["c2st"] for r in results if "c2st" in r]
    return {
        "c2st": results,
        "c2st_mean": sum(done) / len(done) if done else None,
        "c2st_observations": len(done),
        "c2st_wall_s": sum(r.get("sample_s", 0.0) + r.get("c2st_s", 0.0) for r in results),
        "sbibm_npe": SBIBM_NPE.get(task, {}).get(budget),
        "sbibm_npe_rerun": SBIBM_NPE_RERUN.get(task, {}).get(budget),
    }


def sbibm_location(args: argparse.Namespace) -> str | None:
    """Where sbibm's files are (fetched once into the cache if need be), or None for `own`;
    a missing or wrong wheel ends the bench here, in one line, before any run starts."""
    if args.observations_from != "sbibm":
        return None
    from trainforge.workloads.sbi import sbibm_data

    try:
        return str(sbibm_data.locate(args.sbibm_path))
    except sbibm_data.SbibmDataError as exc:
        print(f"sbi_accuracy: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


def header(args: argparse.Namespace, sbibm_path: str | None) -> dict[str, Any]:
    """What every report records: when, where, and what the scores were computed at."""
    from trainforge.workloads.sbi import sbibm_data

    return {
        "date": time.strftime("%Y-%m-%d"),
        "host_cpus": os.cpu_count(),
        "usable_cpus": usable_cpus(),
        "observations_from": args.observations_from,
        "sbibm_version": sbibm_data.VERSION if sbibm_path else None,
        "sbibm_path": sbibm_path,
        "observations": list(range(1, args.observations + 1)),
        "samples": args.samples,
        "c2st": "trainforge.workloads.sbi.c2st (sbi c2st, sbibm MLP settings, float32), seed 1",
        "c2st_workers": args.c2st_workers,
    }


def score_folder(args: argparse.Namespace, sbibm_path: str | None) -> None:
    """C2ST of posteriors trained elsewhere (e.g. on the GPU machine), on this host's cores.
    Files are ``<task>_<budget>.pt``, or ``<task>_<budget>.<member>.pt`` for several runs of
    one cell: each is scored alone, and with ``--ensembles`` the members also as one mixture
    (reported as budget ``<budget>.ensemble``; ``--mixtures-only``: the mixture alone)."""
    # in the order of --tasks, so that the cheaper comparisons can be put first
    rank = {task: i for i, task in enumerate(args.tasks)}

    def cell(file: Path) -> tuple[str, str, str]:
        """(task, budget, member) of ``<task>_<budget>[.<member>].pt``."""
        name, _, member = file.name.removesuffix(".pt").partition(".")
        task, _, budget = name.rpartition("_")
        return task, budget, member

    files = sorted((f for f in args.score.glob("*.pt") if cell(f)[0] in rank),
                   key=lambda f: (rank[cell(f)[0]], f.name))  # fmt: skip
    groups: dict[tuple[str, str], list[Path]] = {}
    for file in files:
        groups.setdefault(cell(file)[:2], []).append(file)
    # (task, budget, label, posteriors); the mixtures first: they are what was asked
    jobs = [(task, budget, f"{budget}.ensemble", members)
            for (task, budget), members in groups.items()
            if args.ensembles and len(members) > 1]  # fmt: skip
    for file in files if not args.mixtures_only else []:
        task, budget, member = cell(file)
        jobs.append((task, budget, f"{budget}.{member}" if member else budget, [file]))
    pool = ProcessPoolExecutor(max_workers=args.c2st_workers)
    futures = [submit_scores(pool, posteriors, task, args, sbibm_path)
               for task, _, _, posteriors in jobs]  # fmt: skip
    report = header(args, sbibm_path) | {"scored_folder": str(args.score), "runs": {}}
    for (task, budget, label, posteriors), pending in zip(jobs, futures, strict=True):
        entry = scored(task, budget, [f.result() for f in pending])
        if len(posteriors) > 1:
            entry["members"] = [p.name for p in posteriors]
        report["runs"][f"{task}/{label}"] = entry
        print(f"[bench] {task} {label}: C2ST {entry['c2st_mean']:.3f}", flush=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0))


def start_ray(head_cpus: int, gpus: int) -> tuple[subprocess.Popen, dict[str, str]]:
    """The bench's own Ray head (``startup.start_head``) with these CPUs and GPUs."""
    from startup import start_head

    env = dict(os.environ, RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="2")
    return start_head(RAY, env, f"--num-cpus={head_cpus}", f"--num-gpus={gpus}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budgets", nargs="+", default=["1e4", "1e5"])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument(
        "--runs", nargs="+", help="TASK/BUDGET pairs to train instead of every task × budget"
    )
    parser.add_argument("--observations", type=int, default=10, help="score at 1..this")
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument(
        "--observations-from",
        choices=("sbibm", "own"),
        default="sbibm",
        help="sbibm's stored observations and reference samples, or this project's own",
    )
    parser.add_argument(
        "--sbibm-path", help="sbibm 1.1.0 wheel or folder (default: $TRAINFORGE_SBIBM, cache)"
    )
    # the CPUs this process may use, not the machine's: a cpuset or taskset may confine it
    usable = usable_cpus()
    parser.add_argument("--concurrent-runs", type=int, default=max(1, min(8, usable // 2)))
    parser.add_argument("--gpu-share", type=float, default=0.25, help="GPU fraction per run")
    parser.add_argument("--c2st-workers", type=int, default=max(1, usable - 10))
    parser.add_argument("--deadline-s", type=float, default=540)
    parser.add_argument("--overrides", nargs="*", default=[], help="extra recipe overrides")
    parser.add_argument(
        "--keep-posteriors", type=Path, help="copy each run's posterior.pt (and log) here"
    )
    parser.add_argument(
        "--score", type=Path, help="only score the <task>_<budget>.pt posteriors in this folder"
    )
    parser.add_argument(
        "--ensembles", action="store_true",
        help="with --score: also score each <task>_<budget>.<member>.pt group as one mixture",
    )  # fmt: skip
    parser.add_argument(
        "--mixtures-only", action="store_true",
        help="with --ensembles: score the mixtures, not each member alone",
    )  # fmt: skip
    args = parser.parse_args()
    if args.mixtures_only and not args.ensembles:
        parser.error("--mixtures-only needs --ensembles")
    sbibm_path = sbibm_location(args)
    if args.score is not None:
        score_folder(args, sbibm_path)
        return
    deadline = time.monotonic() + args.deadline_s

    import torch

    gpus = torch.cuda.device_count()
    work = Path(tempfile.mkdtemp(prefix="sbi-accuracy-"))
    # each run's worker and its simulation chunks; no more than the CPUs there are
    head, env = start_ray(head_cpus=max(args.concurrent_runs + 1, usable), gpus=gpus)
    scaling = (
        [
            "scaling.use_gpu=true",
            f"scaling.resources_per_worker={{GPU: {args.gpu_share}, CPU: 1}}",
            "workload.simulation.device=cpu",  # a GPU chunk task would wait for a whole GPU
        ]
        if gpus
        else ["scaling.use_gpu=false"]
    )
    # the runs' own evaluation (no C2ST; the bench scores) reads the observations it is told to
    source = [f"workload.evaluation.observations_from={args.observations_from}"]
    if sbibm_path:
        source.append(f"workload.evaluation.sbibm_path={sbibm_path}")
    queue = [(task, budget) for budget in args.budgets for task in args.tasks]
    if args.runs:
        queue = [tuple(run.split("/", 1)) for run in args.runs]
    running: dict[tuple[str, str], tuple[subprocess.Popen, Any, float]] = {}
    pool = ProcessPoolExecutor(max_workers=args.c2st_workers) if args.c2st_workers else None
    scores: dict[tuple[str, str], list[Future]] = {}
    report = header(args, sbibm_path) | {
        "gpu": torch.cuda.get_device_name(0) if gpus else None,
        "gpus": gpus,
        "recipes": {budget: f"recipes/sbi/npe_{budget}.yaml" for budget in args.budgets},
        "overrides": scaling + args.overrides,
        "runs": {},
    }

    def save() -> None:
        args.out.write_text(json.dumps(report, indent=2) + "\n")

    def record(key: tuple[str, str], results: list[dict[str, Any]]) -> None:
        entry = report["runs"][f"{key[0]}/{key[1]}"]
        entry |= scored(*key, results)
        print(f"[bench] {key[0]} {key[1]}: C2ST {entry['c2st_mean']} over {len(results)} obs")
        save()

    while (queue or running or any(scores.values())) and time.monotonic() < deadline:
        while queue and len(running) < args.concurrent_runs:
            task, budget = queue.pop(0)
            recipe = ROOT / "recipes" / "sbi" / f"npe_{budget}.yaml"  # the task is an override
            log = open(work / f"{task}_{budget}.log", "w")  # noqa: SIM115 - closed when done
            command = [
                sys.executable, "-m", "trainforge", "train", str(recipe), f"workload.task={task}",
                f"run.storage_path={work / 'runs'}", "tracking.enabled=false",
                "workload.evaluation.c2st=false", *source, *scaling, *args.overrides,
            ]  # fmt: skip
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
            running[(task, budget)] = (process, log, time.monotonic())
        time.sleep(2)
        for key, futures in scores.items():  # a run's scores, once all of them are in
            if futures and all(f.done() for f in futures):
                record(key, [f.result() for f in futures])
                scores[key] = []
        for key, (process, log, started) in list(running.items()):
            if process.poll() is None:
                continue
            log.close()
            del running[key]
            task, budget = key
            run_dir = work / "runs" / f"{task}_npe_{budget}"
            entry: dict[str, Any] = {
                "exit_code": process.returncode,
                "train_wall_s": time.monotonic() - started,
                "log_tail": (work / f"{task}_{budget}.log").read_text()[-3000:],
            }
            report["runs"][f"{task}/{budget}"] = entry
            posterior = run_dir / "posterior.pt"
            print(
                f"[bench] {task} {budget}: exit {process.returncode}, {entry['train_wall_s']:.0f} s"
            )
            save()  # partial results early
            if args.keep_posteriors is not None and posterior.is_file():
                args.keep_posteriors.mkdir(parents=True, exist_ok=True)
                shutil.copy(posterior, args.keep_posteriors / f"{task}_{budget}.pt")
                shutil.copy(work / f"{task}_{budget}.log", args.keep_posteriors)
            if pool is not None and process.returncode == 0 and posterior.is_file():
                scores[key] = submit_scores(pool, [posterior], task, args, sbibm_path)
    for (task, budget), (process, log, started) in running.items():  # past the deadline
        process.kill()
        log.close()
        report["runs"][f"{task}/{budget}"] = {
            "exit_code": None,
            "killed_at_deadline_after_s": time.monotonic() - started,
            "log_tail": (work / f"{task}_{budget}.log").read_text()[-3000:],
        }
    for key, futures in scores.items():  # past the deadline: what finished within 45 s more
        if not futures:
            continue
        results = []
        for future in futures:
            try:
                results.append(future.result(timeout=max(1.0, deadline + 45 - time.monotonic())))
            except Exception as exc:  # a C2ST that did not finish in time is reported as such
                future.cancel()
                results.append({"error": repr(exc)})
        record(key, results)
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)
    os.killpg(head.pid, signal.SIGTERM)  # the head's own session: it and its node
    head.wait(timeout=60)
    save()
    print(json.dumps({k: v.get("c2st_mean") for k, v in report["runs"].items()}, indent=2))


if __name__ == "__main__":
    main()
