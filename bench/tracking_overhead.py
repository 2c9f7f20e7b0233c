"""MLflow tracking overhead on the digits recipe: step time with tracking on vs off.

Both variants run alternately in one process on one local Ray instance, ``--repeats`` times
each. Two numbers come out:

- ``wall``: mean training seconds per optimizer step, on vs off (noisy on small machines:
  the spread across repeats is reported alongside);
- ``in_loop``: the time the training thread itself spent in tracking calls (buffering metrics,
  committing them at checkpoints), as a share of training time — the cost tracking adds to
  the critical path; sending happens on a background thread.

Usage: python bench/tracking_overhead.py [--epochs 40] [--repeats 3] [--tracking-uri URI]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIGITS = ROOT / "recipes" / "cnn" / "digits_simple_cnn.yaml"


def one_run(tracking: bool, epochs: int, workdir: Path, uri: str | None, index: int) -> dict:
    from trainforge import config
    from trainforge.driver import launch

    overrides = [
        f"run.name=overhead-{'on' if tracking else 'off'}-{index}",
        f"run.storage_path={workdir / 'runs'}",
        f"train.epochs={epochs}",
        f"tracking.enabled={str(tracking).lower()}",
    ]
    if uri:
        overrides.append(f"tracking.tracking_uri={uri}")
    outcome = launch.train(config.load(DIGITS, overrides))
    assert outcome.exit_code == 0
    steps = outcome.metrics["epoch"] * 22  # 1437 samples, 2 workers × batch 32 → 22 steps
    return {
        "train_s": outcome.metrics["perf/train_s"],
        "step_ms": 1000 * outcome.metrics["perf/train_s"] / steps,
        "tracking_s": outcome.metrics["perf/tracking_s"],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tracking-uri", default=None, help="default: SQLite in a temp dir")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

    workdir = Path(tempfile.mkdtemp(prefix="trainforge-overhead-"))
    os.chdir(workdir)  # the embedded SQLite store lands here
    runs: dict[str, list[dict]] = {"off": [], "on": []}
    for index in range(args.repeats):
        for variant in ("off", "on"):
            runs[variant].append(
                one_run(variant == "on", args.epochs, workdir, args.tracking_uri, index)
            )

    def summary(rows: list[dict]) -> dict:
        steps = [r["step_ms"] for r in rows]
        return {"step_ms_mean": statistics.mean(steps), "step_ms_all": steps}

    off, on = summary(runs["off"]), summary(runs["on"])
    in_loop = [r["tracking_s"] / r["train_s"] for r in runs["on"]]
    result = {
        "benchmark": "digits SimpleCNN, 2 CPU workers (gloo), batch 32, tracking on vs off",
        "store": args.tracking_uri or "sqlite (embedded default)",
        "epochs": args.epochs,
        "repeats": args.repeats,
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "date": time.strftime("%Y-%m-%d"),
        "off": off,
        "on": on,
        "wall_overhead_pct": 100 * (on["step_ms_mean"] / off["step_ms_mean"] - 1),
        "in_loop_overhead_pct": 100 * statistics.mean(in_loop),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
