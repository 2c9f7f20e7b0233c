"""Host memory of the SBI data path, in memory vs streamed from disk, on the same cache entry.

A cache entry of N simulations with a wide x (the case streaming is for: images, time series)
is written in the simulation stage's layout; then, in a fresh process per variant, the workload
builds its splits and the loop batches one epoch. Each process reports its peak resident set
(``ru_maxrss``) and the time taken.

Usage (repo root):  python bench/sbi_stream_memory.py --out stream_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def write_entry(folder: Path, n: int, chunk_size: int, dim_x: int) -> None:
    import torch

    from trainforge.workloads.sbi import simulations

    folder.mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)
    for i, start in enumerate(range(0, n, chunk_size)):
        size = min(chunk_size, n - start)
        theta = torch.rand(size, 2, generator=generator)
        x = theta.repeat(1, dim_x // 2) + 0.1 * torch.randn(size, dim_x, generator=generator)
        torch.save({"theta": theta, "x": x, "invalid": 0}, simulations.chunk_file(folder, i))
    manifest = {
        "num_simulations": n, "chunk_size": chunk_size, "chunks": -(-n // chunk_size),
        "invalid": 0, "dim_theta": 2, "dim_x": dim_x,
    }  # fmt: skip
    simulations.write_json(folder / simulations.MANIFEST, manifest)


def measure(folder: Path, streaming: str, window_rows: int) -> dict:
    """In this (fresh) process: the workload's splits, then one epoch of batches."""
    import torch

    from trainforge import config
    from trainforge.data import sharding
    from trainforge.distributed import WorkerContext
    from trainforge.workloads.sbi.workload import SBIWorkload

    recipe = ROOT / "recipes" / "sbi" / "two_moons_debug.yaml"
    overrides = [f"workload.stream_from_disk={streaming}"]
    cfg = config.load(recipe, [*overrides, f"workload.stream_window_rows={window_rows}"])
    cfg.workload.simulation.path = str(folder)
    ctx = WorkerContext(0, 0, 1, 0, torch.device("cpu"))
    started = time.perf_counter()
    workload = SBIWorkload(cfg.workload, seed=0)
    train, _ = workload.datasets(ctx.device)
    workload.build_model()
    setup_s = time.perf_counter() - started
    batches = sharding.TrainBatches(train, ctx, batch_size=4096, seed=0)
    count = sum(1 for _ in batches.epoch(0))
    return {
        "stream_from_disk": streaming,
        "window_rows": window_rows,
        "setup_s": setup_s,
        "epoch_s": time.perf_counter() - started - setup_s,
        "batches": count,
        "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6,  # KiB on Linux
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--simulations", type=int, default=1_000_000)
    parser.add_argument("--dim-x", type=int, default=200)
    parser.add_argument("--chunk-size", type=int, default=50_000)
    parser.add_argument("--window-rows", type=int, default=100_000)
    parser.add_argument(
        "--measure", nargs=2, metavar=("FOLDER", "STREAMING"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.measure:  # the child process
        print(json.dumps(measure(Path(args.measure[0]), args.measure[1], args.window_rows)))
        return
    with tempfile.TemporaryDirectory(prefix="sbi-stream-") as work:
        folder = Path(work) / "entry"
        write_entry(folder, args.simulations, args.chunk_size, args.dim_x)
        size_gb = sum(f.stat().st_size for f in folder.glob("chunk-*.pt")) / 1e9
        report = {
            "date": time.strftime("%Y-%m-%d"),
            "host_cpus": os.cpu_count(),
            "simulations": args.simulations,
            "dim_x": args.dim_x,
            "chunk_size": args.chunk_size,
            "entry_gb": size_gb,
            "runs": [],
        }
        for streaming in ("false", "true"):
            child = [
                sys.executable, __file__, "--out", str(args.out), "--window-rows",
                str(args.window_rows), "--measure", str(folder), streaming,
            ]  # fmt: skip
            done = subprocess.run(child, capture_output=True, text=True, check=True)
            report["runs"].append(json.loads(done.stdout.strip().splitlines()[-1]))
            print(report["runs"][-1], flush=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
