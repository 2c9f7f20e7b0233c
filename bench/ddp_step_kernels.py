"""Where the graphed DDP step's time goes, kernel by kernel: one GPU alone against DDP.

On 2 H200s DDP without any communication (``ddp_scaling_options.py``'s ``nocomm``) ran the
shipped graphed ResNet-18 step 3.9% slower per GPU than one GPU alone, while every GPU of the
host running its own one-GPU run lost nothing (bench/results, thirty-eighth session): the cost
is DDP's, not the host's. This profiles the replays of trainforge's worker loop
(``cnn_throughput.trainforge_loop`` with the recipe's own profiler window,
``tracking.profile_steps``) and sums rank 0's GPU activity per step: kernels, copies and sets,
their time, the span from the first to the last, the time the GPU is busy with any of them,
per stream and per kernel name. ``--compare`` lines two such files up, the kernels whose time
per step differs first.

Usage (GPU machine; one launch per GPU count, ``ddp_scaling_options.py``'s options):
    torchrun --standalone --nproc_per_node=1 bench/ddp_step_kernels.py --options bucket10 \\
        --out one.json
    torchrun --standalone --nproc_per_node=2 bench/ddp_step_kernels.py \\
        --options bucket10 nocomm --out two.json
    python bench/ddp_step_kernels.py --compare one.json:bucket10 two.json:nocomm
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

GPU_EVENTS = ("kernel", "gpu_memcpy", "gpu_memset")
PROFILED_STEPS = 20
PROFILE_FROM_STEP = 400


def busy_us(intervals: list[tuple[float, float]]) -> float:
    """The time covered by at least one of the (start, end) intervals."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def summarise(trace: dict[str, Any], steps: int) -> dict[str, Any]:
    """Per-step sums of a Chrome trace's GPU events (one device's)."""
    events = [
        e for e in trace["traceEvents"] if e.get("cat") in GPU_EVENTS and e.get("dur") is not None
    ]
    if not events:
        raise SystemExit("the trace holds no GPU events: was the CUDA activity profiled?")
    intervals = [(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in events]
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    by_stream: dict[str, float] = defaultdict(float)
    for e in events:
        by_name[e["name"][:120]][0] += 1
        by_name[e["name"][:120]][1] += float(e["dur"])
        by_stream[str(e.get("args", {}).get("stream"))] += float(e["dur"])
    launches = sum(1 for e in trace["traceEvents"] if e.get("name") == "cudaGraphLaunch")
    top = sorted(by_name.items(), key=lambda item: -item[1][1])
    return {
        "steps": steps,
        "graph_launches_per_step": launches / steps,
        "events_per_step": len(events) / steps,
        "gpu_us_per_step": sum(float(e["dur"]) for e in events) / steps,
        "span_us_per_step": (max(end for _, end in intervals) - min(s for s, _ in intervals))
        / steps,
        "busy_us_per_step": busy_us(intervals) / steps,
        "stream_us_per_step": {k: v / steps for k, v in by_stream.items()},
        "kernels": {
            name: {"per_step": count / steps, "us_per_step": us / steps}
            for name, (count, us) in top
        },
    }


def newest_trace(since: float) -> Path:
    """The rank-0 trace the worker loop's profiler wrote after ``since`` (``profiling.py``)."""
    import tempfile

    found = [
        p
        for p in Path(tempfile.gettempdir()).glob("trainforge-profile-*/trace_rank0.json")
        if p.stat().st_mtime >= since
    ]
    if not found:
        raise SystemExit("the worker loop wrote no profiler trace")
    return max(found, key=lambda p: p.stat().st_mtime)


def profile_options(args: argparse.Namespace) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from cnn_throughput import trainforge_loop
    from ddp_scaling_options import use

    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    torch.distributed.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    result: dict[str, Any] = {"gpu": torch.cuda.get_device_name(0), "gpus": world, "runs": {}}
    window = [
        f"tracking.profile_steps={PROFILED_STEPS}",
        f"tracking.profile_start_step={PROFILE_FROM_STEP}",
    ]
    for option in args.options:
        use(option)
        started = time.time()
        rate = trainforge_loop("sgd", args.batch, args.steps, True, window)
        torch.distributed.barrier()
        if rank == 0:
            summary = summarise(json.loads(newest_trace(started).read_text()), PROFILED_STEPS)
            summary["samples_per_s"] = rate
            result["runs"][option] = summary
            print(
                f"[kernels] {option} on {world} GPU(s): {rate:,.0f} samples/s; per step "
                f"{summary['busy_us_per_step']:.0f} µs busy of {summary['span_us_per_step']:.0f}, "
                f"{summary['events_per_step']:.0f} GPU events",
                flush=True,
            )
    if rank == 0:
        args.out.write_text(json.dumps(result, indent=1))
    torch.distributed.destroy_process_group()


def compare(left_spec: str, right_spec: str, rows: int = 25) -> None:
    """Print two runs' per-step sums side by side, and the kernels that differ most."""
    runs = []
    for spec in (left_spec, right_spec):
        path, _, option = spec.partition(":")
        data = json.loads(Path(path).read_text())
        runs.append((f"{data['gpus']} GPU {option}", data["runs"][option]))
    (ln, left), (rn, right) = runs
    print(f"{'per step':<28}{ln:>18}{rn:>18}")
    for key in ("samples_per_s", "span_us_per_step", "busy_us_per_step", "gpu_us_per_step",
                "events_per_step", "graph_launches_per_step"):  # fmt: skip
        print(f"{key:<28}{left[key]:>18,.1f}{right[key]:>18,.1f}")
    names = set(left["kernels"]) | set(right["kernels"])
    empty = {"per_step": 0.0, "us_per_step": 0.0}
    diffs = sorted(
        names,
        key=lambda n: (
            -abs(
                right["kernels"].get(n, empty)["us_per_step"]
                - left["kernels"].get(n, empty)["us_per_step"]
            )
        ),
    )
    print(f"\nkernels whose µs per step differ most ({ln} → {rn}): calls, µs")
    for name in diffs[:rows]:
        a, b = left["kernels"].get(name, empty), right["kernels"].get(name, empty)
        print(
            f"{a['per_step']:6.1f} {a['us_per_step']:9.1f} → {b['per_step']:6.1f} "
            f"{b['us_per_step']:9.1f}  {name[:90]}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("ddp_step_kernels.json"))
    parser.add_argument("--options", nargs="+", default=["bucket10"])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--compare", nargs=2, metavar="FILE:OPTION")
    args = parser.parse_args()
    if args.compare:
        compare(*args.compare)
    else:
        profile_options(args)


if __name__ == "__main__":
    main()
