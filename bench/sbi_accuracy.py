"""SBI accuracy table: C2ST of NPE over the first 10 observations of each benchmark task, at
each simulation budget, with the recipes in recipes/sbi/ as they are.

Each recipe runs through ``trainforge train`` against one Ray cluster (``ray start --head`` on
this machine), several at once with a fraction of a GPU each (the estimators are small and
launch-bound, so a GPU serves several runs). C2ST is computed with sbibm's definition (our
``trainforge.workloads.sbi.c2st``) in a process pool on the host's CPU cores as soon as a run's
``posterior.pt`` exists: 10,000 posterior samples from the exported ``DirectPosterior`` (what
an sbi user loads) against 10,000 reference samples, per observation.

Usage (repo root):
    python bench/sbi_accuracy.py --budgets 1e4 1e5 1e6 --out sbi_accuracy.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
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
# sbibm paper (Lueckmann et al. 2021), NPE row, C2ST at 10^4 and 10^5 simulations
SBIBM_NPE = {
    "two_moons": {"1e4": 0.61, "1e5": 0.54},
    "gaussian_linear": {"1e4": 0.55, "1e5": 0.51},
    "gaussian_mixture": {"1e4": 0.66, "1e5": 0.56},
    "slcp": {"1e4": 0.90, "1e5": 0.83},
    "bernoulli_glm": {"1e4": 0.68, "1e5": 0.56},
}


def c2st_job(posterior_file: str, task: str, observation: int, n: int) -> dict[str, Any]:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    from trainforge.workloads.sbi import load_posterior
    from trainforge.workloads.sbi.c2st import c2st
    from trainforge.workloads.sbi.reference import reference_samples
    from trainforge.workloads.sbi.tasks import get_task

    torch.set_num_threads(1)
    started = time.perf_counter()
    posterior = load_posterior(posterior_file)
    _, x_obs = get_task(task).observation(observation)
    torch.manual_seed(observation)
    samples = posterior.sample((n,), x=x_obs, show_progress_bars=False)
    reference = reference_samples(task, observation, n, seed=observation)
    score = c2st(reference, samples, seed=1)
    return {"observation": observation, "c2st": score, "seconds": time.perf_counter() - started}


def score_folder(args: argparse.Namespace) -> None:
    """C2ST of posteriors trained elsewhere (e.g. on the GPU machine), on this host's cores."""
    # in the order of --tasks, so that the cheaper comparisons can be put first
    rank = {task: i for i, task in enumerate(args.tasks)}
    files = [f for f in args.score.glob("*.pt") if f.stem.rpartition("_")[0] in rank]
    files.sort(key=lambda f: (rank[f.stem.rpartition("_")[0]], f.stem))
    pool = ProcessPoolExecutor(max_workers=args.c2st_workers)
    jobs = {}
    for file in files:
        task, _, budget = file.stem.rpartition("_")
        jobs[(task, budget)] = [
            pool.submit(c2st_job, str(file), task, k, args.samples)
            for k in range(1, args.observations + 1)
        ]
    report: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "samples": args.samples}
    report["c2st_host_cpus"] = os.cpu_count()
    report["runs"] = {}
    for (task, budget), futures in jobs.items():
        results = [f.result() for f in futures]
        scores = [r["c2st"] for r in results]
        report["runs"][f"{task}/{budget}"] = {
            "c2st": results,
            "c2st_mean": sum(scores) / len(scores),
            "sbibm_npe": SBIBM_NPE.get(task, {}).get(budget),
        }
        print(f"[bench] {task} {budget}: C2ST {sum(scores) / len(scores):.3f}", flush=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_ray(head_cpus: int, gpus: int) -> tuple[subprocess.Popen, dict[str, str]]:
    """A Ray head of its own, as a `--block` process that ends this cluster alone when stopped
    (`ray stop` would end every Ray on the machine)."""
    env = dict(os.environ, RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="2")
    # Ray 2.60's `ray start` turns token auth on when a token exists; clients then need the
    # mode set too. Without a token, asking for token mode fails, so leave it off.
    if (Path.home() / ".ray" / "auth_token").is_file():
        env["RAY_AUTH_MODE"] = "token"
    command = [
        *RAY, "start", "--head", "--block", "--node-ip-address=127.0.0.1", "--port=6390",
        f"--num-cpus={head_cpus}", f"--num-gpus={gpus}",
        # a dashboard of its own: a head without one still advertises 127.0.0.1:8265 as its
        # API server, and Ray Train's placement-group cleaner would then ask whichever Ray
        # owns that port whether our runs' controllers live, and remove their workers
        "--include-dashboard=true", "--dashboard-host=127.0.0.1",
        f"--dashboard-port={_free_port()}",
        "--disable-usage-stats", "--ray-client-server-port=10390",
        "--min-worker-port=20000", "--max-worker-port=20999",
    ]  # fmt: skip
    head = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    address = {**env, "RAY_ADDRESS": "127.0.0.1:6390"}
    for _ in range(60):  # until the head answers
        probe = [sys.executable, "-c", "import ray; ray.init(); ray.shutdown()"]
        if subprocess.run(probe, env=address, capture_output=True).returncode == 0:
            return head, address
        time.sleep(1)
    head.terminate()
    raise RuntimeError("the Ray head did not come up")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--budgets", nargs="+", default=["1e4", "1e5"])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument(
        "--runs", nargs="+", help="TASK/BUDGET pairs to train instead of every task × budget"
    )
    parser.add_argument("--observations", type=int, default=10)
    parser.add_argument("--samples", type=int, default=10_000)
    parser.add_argument("--concurrent-runs", type=int, default=8)
    parser.add_argument("--gpu-share", type=float, default=0.25, help="GPU fraction per run")
    parser.add_argument("--c2st-workers", type=int, default=max(1, (os.cpu_count() or 2) - 10))
    parser.add_argument("--deadline-s", type=float, default=540)
    parser.add_argument("--overrides", nargs="*", default=[], help="extra recipe overrides")
    parser.add_argument(
        "--keep-posteriors", type=Path, help="copy each run's posterior.pt (and log) here"
    )
    parser.add_argument(
        "--score", type=Path, help="only score the <task>_<budget>.pt posteriors in this folder"
    )
    args = parser.parse_args()
    if args.score is not None:
        score_folder(args)
        return
    deadline = time.monotonic() + args.deadline_s

    import torch

    gpus = torch.cuda.device_count()
    work = Path(tempfile.mkdtemp(prefix="sbi-accuracy-"))
    head, env = start_ray(head_cpus=args.concurrent_runs + 8, gpus=gpus)  # + simulation chunks
    scaling = (
        [
            "scaling.use_gpu=true",
            f"scaling.resources_per_worker={{GPU: {args.gpu_share}, CPU: 1}}",
            "workload.simulation.device=cpu",  # a GPU chunk task would wait for a whole GPU
        ]
        if gpus
        else ["scaling.use_gpu=false"]
    )
    queue = [(task, budget) for budget in args.budgets for task in args.tasks]
    if args.runs:
        queue = [tuple(run.split("/", 1)) for run in args.runs]
    running: dict[tuple[str, str], tuple[subprocess.Popen, Any, float]] = {}
    pool = ProcessPoolExecutor(max_workers=args.c2st_workers) if args.c2st_workers else None
    scores: dict[tuple[str, str], list[Future]] = {}
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "gpu": torch.cuda.get_device_name(0) if gpus else None,
        "gpus": gpus,
        "host_cpus": os.cpu_count(),
        "samples": args.samples,
        "runs": {},
    }
    while (queue or running) and time.monotonic() < deadline:
        while queue and len(running) < args.concurrent_runs:
            task, budget = queue.pop(0)
            recipe = ROOT / "recipes" / "sbi" / f"npe_{budget}.yaml"  # the task is an override
            log = open(work / f"{task}_{budget}.log", "w")  # noqa: SIM115 - closed when done
            command = [
                sys.executable, "-m", "trainforge", "train", str(recipe), f"workload.task={task}",
                f"run.storage_path={work / 'runs'}", "tracking.enabled=false",
                "workload.evaluation.c2st=false", *scaling, *args.overrides,
            ]  # fmt: skip
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
            running[(task, budget)] = (process, log, time.monotonic())
        time.sleep(2)
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
            args.out.write_text(json.dumps(report, indent=2) + "\n")  # partial results early
            if args.keep_posteriors is not None and posterior.is_file():
                args.keep_posteriors.mkdir(parents=True, exist_ok=True)
                shutil.copy(posterior, args.keep_posteriors / f"{task}_{budget}.pt")
                shutil.copy(work / f"{task}_{budget}.log", args.keep_posteriors)
            if pool is not None and process.returncode == 0 and posterior.is_file():
                scores[key] = [
                    pool.submit(c2st_job, str(posterior), task, k, args.samples)
                    for k in range(1, args.observations + 1)
                ]
    for (task, budget), (process, log, started) in running.items():  # past the deadline
        process.kill()
        log.close()
        report["runs"][f"{task}/{budget}"] = {
            "exit_code": None,
            "killed_at_deadline_after_s": time.monotonic() - started,
            "log_tail": (work / f"{task}_{budget}.log").read_text()[-3000:],
        }
    for key, futures in scores.items():
        entry = report["runs"][f"{key[0]}/{key[1]}"]
        left = max(5.0, deadline + 45 - time.monotonic())
        results = []
        for future in futures:
            try:
                results.append(future.result(timeout=left))
            except Exception as exc:  # a C2ST that did not finish in time is reported as such
                results.append({"error": repr(exc)})
            left = max(1.0, deadline + 45 - time.monotonic())
        entry["c2st"] = results
        done = [r["c2st"] for r in results if "c2st" in r]
        entry["c2st_mean"] = sum(done) / len(done) if done else None
        entry["c2st_observations"] = len(done)
        entry["sbibm_npe"] = SBIBM_NPE.get(key[0], {}).get(key[1])
        print(f"[bench] {key[0]} {key[1]}: C2ST {entry['c2st_mean']} over {len(done)} obs")
    if pool is not None:
        pool.shutdown(wait=False, cancel_futures=True)
    head.terminate()
    head.wait(timeout=60)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({k: v.get("c2st_mean") for k, v in report["runs"].items()}, indent=2))


if __name__ == "__main__":
    main()
