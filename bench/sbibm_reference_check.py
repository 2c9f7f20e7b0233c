"""This project's own reference posterior samplers against sbibm's stored reference samples, at
sbibm's stored observations: C2ST (sbibm's definition) per task and observation, which should
stay ≤ 0.52 (two samplers of the same posterior score about 0.5).

Also checks, from the same files, that the bernoulli_glm task is sbibm's: its design matrix
equals sbibm's ``design_matrix.pt`` and x = Vᵀy reproduces sbibm's stored observations from
their stored spike trains.

Not part of CI (minutes to an hour of CPU: the 10-d comparisons at 10,000 samples take 1-2 min
each on one core). sbibm's wheel comes from ``--sbibm`` / ``$TRAINFORGE_SBIBM`` or the cache,
fetched once from PyPI (``trainforge.workloads.sbi.sbibm_data``).

Usage (repo root):
    python bench/sbibm_reference_check.py --out bench/results/DATE_sbibm_reference_check_HOST.json
    python bench/sbibm_reference_check.py --tasks slcp --observations 1 2 --samples 2000 \
        --out x.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

TASKS = ("two_moons", "gaussian_mixture", "slcp", "gaussian_linear", "bernoulli_glm")
THRESHOLD = 0.52


def check_job(location: str, task: str, observation: int, n: int) -> dict[str, Any]:
    """Own sampler vs sbibm's samples at one of sbibm's observations."""
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    from trainforge.workloads.sbi.c2st import c2st
    from trainforge.workloads.sbi.reference import posterior_samples
    from trainforge.workloads.sbi.sbibm_data import SbibmData

    torch.set_num_threads(1)
    data = SbibmData(Path(location))
    started = time.perf_counter()
    reference = data.reference_samples(task, observation)
    if n < len(reference):  # a random subset: MCMC-made references are stored in chain order
        pick = torch.randperm(len(reference), generator=torch.Generator().manual_seed(observation))
        reference = reference[pick[:n]]
    own = posterior_samples(task, data.observation(task, observation), len(reference), observation)
    sampled = time.perf_counter() - started
    score = c2st(reference, own, seed=1)
    return {
        "observation": observation,
        "c2st": score,
        "passed": score <= THRESHOLD,
        "samples": len(reference),
        "sample_seconds": round(sampled, 2),
        "seconds": round(time.perf_counter() - started, 2),
    }


def bernoulli_glm_matches(location: str) -> dict[str, Any]:
    import torch

    from trainforge.workloads.sbi.sbibm_data import SbibmData
    from trainforge.workloads.sbi.tasks.bernoulli_glm import design_matrix

    data = SbibmData(Path(location))
    ours = design_matrix()
    errors = []
    for k in range(1, 11):
        spikes = data.table("bernoulli_glm", k, "observation_raw.csv")[0].double()
        errors.append((spikes @ ours - data.observation("bernoulli_glm", k).double()).abs().max())
    return {
        "design_matrix_equal": bool(torch.equal(data.design_matrix().double(), ours)),
        # observation.csv holds x rounded to float32's printed digits
        "x_from_spikes_max_abs_error": float(max(errors)),
    }


def hardware() -> dict[str, Any]:
    model = ""
    if Path("/proc/cpuinfo").is_file():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    return {
        "cpu": model or platform.processor(),
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(v, 2) for v in os.getloadavg()],
        "python": platform.python_version(),
    }


def versions() -> dict[str, str]:
    import sbi
    import sklearn
    import torch

    return {"torch": torch.__version__, "sbi": sbi.__version__, "sklearn": sklearn.__version__}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--tasks", nargs="+", default=list(TASKS))
    parser.add_argument("--observations", nargs="+", type=int, default=list(range(1, 11)))
    parser.add_argument("--samples", type=int, default=10_000, help="per side (sbibm: 10,000)")
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--sbibm", help="sbibm's wheel or an unpacked folder")
    parser.add_argument("--note", default="", help="recorded as is (e.g. what else ran)")
    args = parser.parse_args()

    from trainforge.workloads.sbi import sbibm_data

    location = str(sbibm_data.locate(args.sbibm))
    report: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%d"),
        "what": "own reference samplers vs sbibm 1.1.0's reference samples, C2ST per observation",
        "threshold": THRESHOLD,
        "sbibm": {"version": sbibm_data.VERSION, "wheel_sha256": sbibm_data.WHEEL_SHA256},
        "hardware": hardware(),
        "versions": versions(),
        "workers": args.workers,
        "note": args.note,
        "bernoulli_glm": bernoulli_glm_matches(location),
        "tasks": {},
    }
    started = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        jobs = {
            task: [
                pool.submit(check_job, location, task, k, args.samples) for k in args.observations
            ]
            for task in args.tasks
        }
        for task, futures in jobs.items():
            results = [f.result() for f in futures]
            scores = [r["c2st"] for r in results]
            report["tasks"][task] = {
                "c2st_max": max(scores),
                "c2st_mean": sum(scores) / len(scores),
                "passed": all(r["passed"] for r in results),
                "observations": results,
            }
            print(f"[bench] {task}: C2ST max {max(scores):.3f} mean "
                  f"{sum(scores) / len(scores):.3f}", flush=True)  # fmt: skip
            report["seconds"] = round(time.perf_counter() - started, 1)
            args.out.write_text(json.dumps(report, indent=2) + "\n")
    report["passed"] = all(t["passed"] for t in report["tasks"].values())
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"[bench] all ≤ {THRESHOLD}: {report['passed']} ({report['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
