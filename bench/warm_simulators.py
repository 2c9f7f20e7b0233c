"""What warm simulators save a user: whole `trainforge simulate` commands of a custom simulator
(the shipped SIR example, N simulations) on the lasting local cluster, with the cluster's warm
simulators (the default) and with `TRAINFORGE_WARM_WORKERS=0` (the stage's Ray tasks start new
worker processes, which import torch, SciPy and the simulator, in every command), in
alternating rounds. Both sides simulate the same N into a cache folder of their own each round,
so neither reuses the other's work; one cluster serves both, started (and its simulators made
warm) by a first command that is not counted.

    python bench/warm_simulators.py --rounds 5 --simulations 2000 --out result.json

Per command: the wall time from the shell, when the stage's first line came and the stage's own
seconds (its last line, `simulations: N in X s`)."""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import startup  # bench/ is not a package: its folder is on the path

# marks of the command's lines (startup.timed_command): when the stage's first line came; its
# own seconds (``stage_done_took_s``)
startup.MARKS["stage"] = re.compile(r"simulations: \d+ of \d+ chunks")
startup.MARKS["stage_done"] = re.compile(r"simulations: [\d,]+ in (?P<s>[\d.]+) s")


def command(folder: Path, simulations: int, cache: str) -> list[str]:
    return [sys.executable, "-m", "trainforge", "simulate", "sir_custom",
            f"workload.simulation.num_simulations={simulations}",
            f"workload.simulation.cache_dir={folder / cache}"]  # fmt: skip


def one(folder: Path, simulations: int, cache: str, env: dict[str, str]) -> dict[str, Any]:
    result = startup.timed_command(command(folder, simulations, cache), env, folder)
    assert result.pop("log_tail") == [] and result["exit_code"] == 0, result
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--simulations", type=int, default=2000)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    folder = Path(tempfile.mkdtemp(prefix="warm-simulators-"))
    env = {**os.environ, "TRAINFORGE_HOME": str(folder / "home"), "OMP_NUM_THREADS": "1"}
    modes = {"warm": env, "new_processes": {**env, "TRAINFORGE_WARM_WORKERS": "0"}}
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    try:
        one(folder, args.simulations, "first", env)  # the cluster and its simulators: not counted
        for round_ in range(args.rounds):
            order = list(modes) if round_ % 2 == 0 else list(reversed(modes))
            for mode in order:
                result = one(folder, args.simulations, f"{mode}-{round_}", modes[mode])
                runs[mode].append(result)
                print(f"round {round_} {mode}: {result['wall_s']} s", flush=True)
    finally:
        startup.stop_cluster(env)
    medians = {
        mode: {key: statistics.median(r[key] for r in results)
               for key in ("wall_s", "stage", "stage_done_took_s")}
        for mode, results in runs.items()
    }  # fmt: skip
    report = {
        "machine": {"platform": platform.platform(), "python": platform.python_version(),
                    "cpus": os.cpu_count(), "usable_cpus": len(os.sched_getaffinity(0))},
        "simulations": args.simulations,
        "rounds": args.rounds,
        "medians": medians,
        "saved_s": round(medians["new_processes"]["wall_s"] - medians["warm"]["wall_s"], 2),
        "runs": runs,
    }  # fmt: skip
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps({k: report[k] for k in ("medians", "saved_s")}))


if __name__ == "__main__":
    main()
