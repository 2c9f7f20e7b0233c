"""C2ST with its folds in one process and in several: seconds per call and the scores (which
must be equal), on fixed samples, in one invocation; the methods alternate, and the pool's first
call (its processes start) is reported apart from the later ones.

    python bench/c2st_processes.py --out bench/results/c2st_processes.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

os.environ["OMP_NUM_THREADS"] = "1"

import torch

from trainforge.workloads.sbi.c2st import c2st, usable_processes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--samples", type=int, default=10_000, help="per side")
    parser.add_argument("--dim", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--processes", type=int, default=min(5, usable_processes()))
    args = parser.parse_args()

    generator = torch.Generator().manual_seed(0)
    reference = torch.randn(args.samples, args.dim, generator=generator)
    other = 1.05 * torch.randn(args.samples, args.dim, generator=generator) + 0.05
    c2st(reference[:200], other[:200])  # sklearn's imports, outside the clock
    calls: dict[str, list[float]] = {"one process": [], f"{args.processes} processes": []}
    scores: list[float] = []
    first_pool_call_s = None
    for _ in range(args.repeats):
        for label, processes in (
            ("one process", 1),
            (f"{args.processes} processes", args.processes),
        ):
            started = time.perf_counter()
            scores.append(c2st(reference, other, processes=processes))
            seconds = time.perf_counter() - started
            if processes > 1 and first_pool_call_s is None:
                first_pool_call_s = seconds  # includes the pool's start
                continue
            calls[label].append(seconds)
            print(f"[bench] {label}: {seconds:.2f} s, c2st {scores[-1]:.5f}", flush=True)
    document = {
        "bench": "c2st_processes", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "usable_cpus": usable_processes()},
        "samples_per_side": args.samples, "dim": args.dim,
        "first_pool_call_s": first_pool_call_s,
        "seconds": calls, "median_s": {k: statistics.median(v) for k, v in calls.items() if v},
        "scores_equal": len(set(scores)) == 1, "score": scores[0],
    }  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(json.dumps(document["median_s"]), "scores equal:", document["scores_equal"])
    return 0 if document["scores_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
