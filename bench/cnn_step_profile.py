"""Where an eager trainforge step differs from the hand-written one: torch.profiler over the same
number of optimizer steps of both, on one GPU, in one process.

Both sides are ``bench/cnn_throughput.py``'s: the hand-written step (``handwritten_steps``,
its ``handwritten_step``, shared) and trainforge's worker loop on
``recipes/cnn/synthetic_resnet18_bench.yaml`` with ``precision.cuda_graphs=false``, its own
profiler window (``tracking.profile_steps``) after the same warm-up. For each side: host time
per step, CUDA kernels per step, and every operator whose calls per step differ between the
two, so what the loop adds (or saves) per step is a list, not a guess.

Usage (GPU machine):  python bench/cnn_step_profile.py --out profile.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cnn_throughput import LR, MOMENTUM, RECIPE, WEIGHT_DECAY, handwritten_step


def handwritten_steps(optimizer_name: str, batch: int, warmup: int, steps: int) -> profile:
    """The hand-written loop: ``warmup`` steps, then ``steps`` steps under the profiler."""
    step = handwritten_step(optimizer_name, batch, torch.device("cuda", 0))
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    prof = profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA])
    with prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    return prof


def trainforge_steps(optimizer_name: str, batch: int, warmup: int, steps: int) -> profile:
    """trainforge's worker loop (world size 1) with its own profiler window after ``warmup``."""
    from trainforge import config
    from trainforge.checkpoint import FolderReporter
    from trainforge.distributed import WorkerContext
    from trainforge.tracking.worker import WorkerTracker
    from trainforge.worker.state import Checkpointer
    from trainforge.worker.trainer import Trainer, setup_backends

    total = warmup + steps + 1  # the window closes after the step that follows its last
    cfg = config.load(
        RECIPE,
        [
            f"train.optimizer={optimizer_name}",
            f"train.lr={LR[optimizer_name]}",
            f"train.momentum={MOMENTUM}",
            f"train.weight_decay={WEIGHT_DECAY}",
            f"train.batch_size={batch}",
            f"train.max_steps={total}",
            f"train.log_every_steps={total}",
            "tracking.enabled=false",
            f"tracking.profile_steps={steps}",
            f"tracking.profile_start_step={warmup}",
            f"workload.synthetic_train_size={batch * total}",
            "workload.synthetic_val_size=1024",
            "scaling.use_all_gpus=false",
            "scaling.num_workers=1",
            "precision.cuda_graphs=false",
        ],
    )
    ctx = WorkerContext(0, 0, 1, 0, torch.device("cuda", 0))
    setup_backends(cfg.precision, ctx)
    tracker = WorkerTracker(None, cfg.tracking, ctx)
    trainer = Trainer(cfg, ctx, tracker, resume_from=None)
    with tempfile.TemporaryDirectory(prefix="tf-profile-") as folder:
        reporter = FolderReporter(Path(folder))
        checkpointer = Checkpointer(cfg.checkpoint, ctx, "", reporter, tracker)
        trainer.train_epoch(checkpointer)
    assert trainer.profiler.profiler is not None and trainer.profiler.trace is not None
    return trainer.profiler.profiler


def per_step(prof: profile, steps: int) -> dict[str, Any]:
    """Host time and kernels per step, and calls/host time per step of every operator."""
    events = prof.events()
    kernels = sum(1 for e in events if e.device_type.name == "CUDA")
    ops: dict[str, dict[str, float]] = {}
    for avg in prof.key_averages():
        if avg.device_type.name != "CPU":
            continue
        ops[avg.key] = {
            "calls": avg.count / steps,
            "self_cpu_us": avg.self_cpu_time_total / steps,
        }
    host = max(e.time_range.end for e in events) - min(e.time_range.start for e in events)
    return {"kernels_per_step": kernels / steps, "profiled_us_per_step": host / steps, "ops": ops}


def compare(hand: dict[str, Any], tf: dict[str, Any]) -> list[dict[str, Any]]:
    """Operators whose calls per step differ, largest difference in host time first."""
    rows = []
    for name in sorted(set(hand["ops"]) | set(tf["ops"])):
        a = hand["ops"].get(name, {"calls": 0.0, "self_cpu_us": 0.0})
        b = tf["ops"].get(name, {"calls": 0.0, "self_cpu_us": 0.0})
        if abs(a["calls"] - b["calls"]) > 0.01:
            rows.append(
                {
                    "op": name,
                    "hand_calls": a["calls"],
                    "tf_calls": b["calls"],
                    "hand_self_us": a["self_cpu_us"],
                    "tf_self_us": b["self_cpu_us"],
                }
            )
    return sorted(rows, key=lambda r: -abs(r["tf_self_us"] - r["hand_self_us"]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("cnn_step_profile.json"))
    parser.add_argument("--optimizers", nargs="+", default=["sgd", "adamw"])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    result: dict[str, Any] = {
        "gpu": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "batch": args.batch,
        "steps": args.steps,
        "by_optimizer": {},
    }
    for name in args.optimizers:
        hand = per_step(handwritten_steps(name, args.batch, args.warmup, args.steps), args.steps)
        tf = per_step(trainforge_steps(name, args.batch, args.warmup, args.steps), args.steps)
        differing = compare(hand, tf)
        result["by_optimizer"][name] = {
            "handwritten": {k: v for k, v in hand.items() if k != "ops"},
            "trainforge_eager": {k: v for k, v in tf.items() if k != "ops"},
            "ops_that_differ": differing,
            "top_ops_trainforge": sorted(
                ({"op": k, **v} for k, v in tf["ops"].items()), key=lambda r: -r["self_cpu_us"]
            )[:25],
        }
        print(
            f"[profile] {name}: handwritten {hand['kernels_per_step']:.0f} kernels/step, "
            f"{hand['profiled_us_per_step'] / 1e3:.2f} ms/step profiled; trainforge "
            f"{tf['kernels_per_step']:.0f}, {tf['profiled_us_per_step'] / 1e3:.2f} ms"
        )
        for row in differing[:30]:
            print(
                f"  {row['op'][:60]:60s} calls {row['hand_calls']:6.2f} -> {row['tf_calls']:6.2f}"
                f"  self {row['hand_self_us']:8.1f} -> {row['tf_self_us']:8.1f} us"
            )
        args.out.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
