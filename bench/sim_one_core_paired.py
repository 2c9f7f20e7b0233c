"""Issue 15's comparison as pairs, at one core (the default) or ``--cores N``: the Ray
simulation stage against sbi's calls, each pair minutes apart at most, many pairs, so a host
whose speed drifts between levels (±30% between repeats on the GPU hosts: bench/results,
sixteenth and nineteenth sessions) is seen by both sides of a pair alike.

``sim_scaling.py`` starts a private Ray for every measurement and times few long points; its
one-core verdict (0.69-0.95 of sbi's best on GPU hosts, 0.95 on this project's CPU) moves with
the host's level from point to point. Here one private Ray of N CPUs is started once (not
timed, as a lasting cluster is started once) and the stage (``simulate.run``: chunks, files,
manifest, as a run does) warmed up, as are sbi's joblib workers (joblib keeps its process pool
between calls); then ``--pairs`` rounds each time the stage, sbi's
``simulate_for_sbi(num_workers=N)`` batched (M/4N per batch; at one core in this process) and
with its default batch of 1, on ``M`` simulations of the shipped SIR example (about
``--seconds`` of N cores at linear scaling), in an order that turns every round. Reported: each
method's median rate, and per round the stage's rate ÷ each sbi call's, with their median and
a bootstrap 95% interval of that median, and the stage's seconds outside its chunks' own work
(``stage_outside_s``: at N cores, the slots' seconds, wall × N, less the chunks').

``--pin``: both sides simulate on the same N CPUs (``sim_scaling.pinned_cpus``), everything else
on the others. These hosts' vCPUs run at unequal speeds that change in time, and a process
stays on the CPU it started on: unpinned, at one core the stage's Ray worker and this process
(where sbi's call simulates) are each timed on a CPU of their own, and a pair compares CPUs as
much as methods (the forty-fifth session saw the same simulator 2.2 to 4.3 s on one host by
CPU and moment, a Ray worker at 1.16 of this process). Ray starts on the other CPUs; before
every round its workers and joblib's (by command line) move to the simulating CPUs, and this
process's thread moves there for sbi's calls only. Each round records the simulating
processes not on those CPUs after it (``off_pinned_cpus``, 0 when the pinning held).

``--warm``: the stage a second way in every round, ``trainforge_warm``: through warm simulators
(``warm_pool.simulators``, as on the lasting local cluster, where a user's commands run), the
private Ray standing in for that cluster (the stage is told it joined one; the simulators'
slot locks go to a temporary ``TRAINFORGE_HOME``). Their calls queue in the simulator
process, where Ray's tasks are each given a worker.

    python bench/sim_one_core_paired.py --out paired.json [--cores 1] [--pairs 15] [--seconds 1.5]
        [--pin] [--warm]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_scaling import (  # sets OMP_NUM_THREADS=1 before torch's import
    Writer,
    descendants,
    hardware,
    off_cpus,
    pin_simulators,
    pinned_cpus,
    ray_worker,
    serial_seconds_per_simulation,
    software,
    stage_section,
)

SBI_METHODS = ("sbi_batched", "sbi_batch_1")


def simulator(command: str) -> bool:
    """A process that simulates for one side: a Ray worker, or one of joblib's (loky's)."""
    return ray_worker(command) or "loky" in command


def median_interval(values: list[float], draws: int = 2000) -> tuple[float, float]:
    """A bootstrap 95% interval of the median of ``values``."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--cores", type=int, default=1, help="CPUs of the stage and of sbi")
    parser.add_argument("--seconds", type=float, default=1.5, help="a call at linear scaling")
    parser.add_argument("--budget-s", type=float, default=400.0, help="start no round after")
    parser.add_argument("--pin", action="store_true", help="both sides on the same CPUs")
    parser.add_argument("--warm", action="store_true", help="the stage on warm simulators too")
    args = parser.parse_args()
    stages = ("trainforge", "trainforge_warm") if args.warm else ("trainforge",)
    methods = (*stages, *SBI_METHODS)
    if args.warm:
        os.environ["TRAINFORGE_HOME"] = tempfile.mkdtemp(prefix="sim_paired_home_")

    import ray
    from sbi.inference import simulate_for_sbi

    from trainforge.driver.cluster import connect
    from trainforge.driver.stage import Runner
    from trainforge.workloads.sbi import simulate
    from trainforge.workloads.sbi.examples import sir

    started = time.perf_counter()
    cost = serial_seconds_per_simulation(200)
    n = max(64 * args.cores, round(args.seconds * args.cores / cost))
    document: dict[str, Any] = {
        "bench": "sim_one_core_paired", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "hardware": hardware(), "software": software(), "serial_ms_per_simulation": cost * 1e3,
        "cores": args.cores, "num_simulations": n, "rounds": [], "complete": False,
        "pinned": args.pin,
    }  # fmt: skip
    writer = Writer(args.out, document)
    scratch = Path(tempfile.mkdtemp(prefix="sim_paired_"))
    prior = sir.prior()

    # the stage's seconds outside its chunks' own (prior draws and simulator calls): dispatch,
    # transfer, files. Counted where the driver unpacks each task's chunks; a package from
    # before ``unpack`` (a baseline) reports none
    chunk_seconds: list[float] = []
    outside: dict[str, float] = {}
    if hasattr(simulate, "unpack"):
        unpack = simulate.unpack

        def counted(*task: Any) -> list[dict[str, Any]]:
            chunks = unpack(*task)
            chunk_seconds.extend(chunk["seconds"] for chunk in chunks)
            return chunks

        simulate.unpack = counted

    def stage(seed: int, outside_key: str = "stage_outside_s") -> float:
        # read before the clock, as a command does; a folder of its own (a cache of its own)
        section = stage_section(n, scratch / f"{outside_key}-{seed}")
        chunk_seconds.clear()
        began = time.perf_counter()
        simulate.run(section, seed, str(scratch), Runner(), quiet=True)
        wall = time.perf_counter() - began
        if chunk_seconds:
            outside[outside_key] = wall * args.cores - sum(chunk_seconds)
        return wall

    simulating, rest = pinned_cpus(args.cores)

    def sbi_call(seed: int, batch: int) -> float:
        if args.pin:  # at one core sbi simulates in this thread
            os.sched_setaffinity(0, simulating)
        began = time.perf_counter()
        simulate_for_sbi(sir.simulate, prior, n, num_workers=args.cores, seed=seed,
                         simulation_batch_size=batch, show_progress_bar=False)  # fmt: skip
        seconds = time.perf_counter() - began
        if args.pin:
            os.sched_setaffinity(0, rest)
        return seconds

    def warm_stage(seed: int) -> float:
        from trainforge.driver import cluster

        cluster._joined_lasting = True  # the stage takes the lasting cluster's warm simulators
        try:
            return stage(seed, "warm_stage_outside_s")
        finally:
            cluster._joined_lasting = False

    calls = {
        "trainforge": stage,
        "trainforge_warm": warm_stage,
        "sbi_batched": lambda seed: sbi_call(seed, max(1, n // (4 * args.cores))),
        "sbi_batch_1": lambda seed: sbi_call(seed, 1),
    }
    if args.pin:
        os.sched_setaffinity(0, rest)  # Ray's processes, and this one's threads, inherit it
    connect(local_only=True, num_cpus=args.cores, num_gpus=0)
    try:
        for method in methods:  # warm-up: the stage's workers start and import; SciPy's too
            calls[method](10_000)
        print(f"[paired] {n} SIR simulations a call on {args.cores} cores "
              f"({cost * 1e3:.2f} ms each serially)")  # fmt: skip
        for round_ in range(args.pairs):
            if time.perf_counter() - started > args.budget_s:
                document["stopped_early"] = f"budget of {args.budget_s:.0f} s"
                break
            shift = round_ % len(methods)
            order = methods[shift:] + methods[:shift]
            if args.pin:  # a worker started since the last round moves too
                pin_simulators(simulating, rest, simulator)
            rates = {method: n / calls[method](round_) for method in order}
            pinning = {}
            if args.pin:
                pids = [pid for pid, command in descendants() if simulator(command)]
                pinning = {"off_pinned_cpus": off_cpus(pids, simulating)}
            document["rounds"].append(
                {"order": list(order), "simulations_per_s": rates, **outside, **pinning}
            )
            writer.save()
            print(f"[paired] round {round_}: " + ", ".join(
                f"{m} {rates[m]:,.0f}/s" for m in methods), flush=True)  # fmt: skip
        else:
            document["complete"] = True
    finally:
        ray.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)
    rounds = [r["simulations_per_s"] for r in document["rounds"]]
    summary: dict[str, Any] = {
        m: {"median_per_s": statistics.median(r[m] for r in rounds)} for m in methods
    }
    pairs = [(mine, other) for mine in stages for other in methods if other != mine]
    for mine, other in pairs:
        ratios = [r[mine] / r[other] for r in rounds]
        low, high = median_interval(ratios)
        summary[f"{mine}_over_{other}"] = {
            "median": statistics.median(ratios), "interval_95": [low, high],
            "rounds_at_or_above": sum(x >= 1.0 for x in ratios), "rounds": len(ratios),
        }  # fmt: skip
    for key in ("stage_outside_s", "warm_stage_outside_s"):
        spent = [r[key] for r in document["rounds"] if key in r]
        if spent:
            summary[key] = {"median": statistics.median(spent), "min": min(spent)}
    document["summary"] = summary
    document["wall_s"] = time.perf_counter() - started
    writer.save()
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
