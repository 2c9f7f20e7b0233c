"""A command started while a cold command's background start is at work, against the cold
command and the settled one, in one invocation.

Each round runs, in this order, with the bench's own TRAINFORGE_HOME:
  cold        — no Ray running (the lasting cluster stopped before): the command trains on
                processes of its own and starts the cluster in the background as it ends
  right_after — the same command again, started the moment the cold one exits: the background
                start (`ray start`, warm workers, their rehearsal) is at work beside it
  settled     — the same command once that background start is done: warm workers

Reported per command: wall seconds, the loop's own seconds (its `finished at step N in X s`
line), overhead (wall − loop), whether it joined the lasting cluster, and how long the
background start had still to go when the right_after command ended.

With --baseline DIR (a folder holding another `trainforge` package, e.g. the commit before a
change, as bench/startup.py takes it), each round runs the three commands of that checkout
too, right after this checkout's, in its own TRAINFORGE_HOME.

    python bench/right_after.py --rounds 3 --baseline /tmp/base --out right_after.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import (  # bench/ is a folder of scripts
    baseline_path,
    settle,
    stop_cluster,
    trainforge_run,
    with_baseline,
)

MODES = ("cold", "right_after", "settled")


def background_running(env: dict[str, str]) -> bool:
    code = "from trainforge.driver import local_cluster as c; print(c.background_start_running())"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return out.stdout.strip() == "True"


def one_round(recipe: str, round_no: int, overrides: list[str], env: dict[str, str],
              work: Path, prefix: str) -> dict[str, dict[str, Any]]:  # fmt: skip
    out: dict[str, dict[str, Any]] = {}
    stop_cluster(env)
    for mode in MODES:
        if mode == "settled":
            waited = time.perf_counter()
            settle(env)
            out["right_after"]["background_left_s"] = round(time.perf_counter() - waited, 2)
        result = trainforge_run(recipe, f"{prefix}{mode}{round_no}", overrides, env, work)
        # a timed `ray:` line is a join of the lasting cluster; own processes print none
        result["on_cluster"] = "ray" in result
        if mode == "right_after":
            result["background_still_running"] = background_running(env)
        out[mode] = result
        shown = {k: v for k, v in result.items() if k != "log_tail"}
        print(prefix + mode, json.dumps(shown), flush=True)
    settle(env)
    return out


def medians_of(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    keys = ("wall_s", "overhead_s", "loop_end_took_s", "first_step")
    return {
        mode: {
            key: statistics.median(r[key] for r in results if key in r)
            for key in keys
            if any(key in r for r in results)
        }
        for mode, results in runs.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipe", default="cnn/digits_simple_cnn")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--baseline", help="a folder holding another `trainforge` package")
    parser.add_argument("--out", default="right_after.json")
    parser.add_argument("overrides", nargs="*", default=["train.epochs=2"])
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tf-right-after-"))
    env = {**os.environ, "TRAINFORGE_HOME": str(work / "home"), "OMP_NUM_THREADS": "1"}
    for name in ("RAY_ADDRESS", "TRAINFORGE_WORKERS"):
        env.pop(name, None)
    arms = {"": env}
    if args.baseline:
        base_env = {**env, "TRAINFORGE_HOME": str(work / "home-baseline")}
        arms["baseline_"] = with_baseline(base_env, baseline_path(args.baseline, env, work))
    runs: dict[str, list[dict[str, Any]]] = {}
    for round_no in range(args.rounds):
        for prefix, arm_env in arms.items():  # interleaved: the machine's load hits both
            done = one_round(args.recipe, round_no, args.overrides, arm_env, work, prefix)
            for mode, result in done.items():
                runs.setdefault(prefix + mode, []).append(result)
    for arm_env in arms.values():
        stop_cluster(arm_env)
    report = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0)),
            "load_average_at_end": os.getloadavg(),
        },
        "recipe": args.recipe,
        "overrides": args.overrides,
        "baseline": args.baseline,
        "rounds": args.rounds,
        "medians": medians_of(runs),
        "runs": runs,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=1))
    for mode, values in report["medians"].items():
        print(mode, values)


if __name__ == "__main__":
    main()
