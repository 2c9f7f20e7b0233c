"""Simulation scaling: simulations/s of a CPU-bound simulator on 1, 2, 4, … all cores, through
trainforge's Ray simulation stage and through sbi's ``simulate_for_sbi(num_workers=N)``
(joblib), on the same host in one invocation, interleaved per core count.

The simulator is the shipped SIR example (``trainforge.workloads.sbi.examples.sir``: one SciPy
ODE solve per simulation, a few ms of one core). First its serial cost is measured in this
process; then for each core count N (1, all, then 2, 4, … in between):

  trainforge — a private Ray with num_cpus=N, the stage (``simulate.run``) on a small warm-up
               entry (its workers start and import), then timed on a fresh cache entry of
               ``M_N`` simulations: chunks written to disk and the manifest, as a run does.
  sbi        — ``simulate_for_sbi(simulate, prior, M_N, num_workers=N)`` as sbi's docs call
               it (simulation_batch_size=1, its default), and with batches of M_N / (4 N)
               (``--sbi-batch 1,auto``: a tuned call), each after a warm-up call that starts
               joblib's workers.
  processes  — the host's own scaling, no framework: N fresh processes, each given M_N / N
               parameters, started and warmed up, then all released at once; the time until
               the last one finishes. Hyper-threads, turbo clocks and shared caches make this
               fall short of linear on many hosts. A static split: where cores run at unequal
               speeds the slowest decides, and a stage handing out small tasks can beat it.

``M_N`` is sized for about ``--seconds`` of work at linear scaling; every method simulates the
same ``M_N`` (one far from linear takes longer). The order of the methods turns at every core
count, and at every repeat (``--repeats``; rates are medians). Efficiency is rate / (N × the
stage's rate on one core); the host's own efficiency is the same for ``processes``; the target
"at least sbi's rate" is checked against sbi's best variant at each core count.
The JSON is rewritten after every measurement, so a run cut short keeps what it measured;
``--budget-s`` stops starting new core counts when the next one would not fit.

    python bench/sim_scaling.py --out bench/results/sim_scaling.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"  # a one-thread simulator, one process per core, both ways
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import torch

REPO = Path(__file__).resolve().parents[1]
RECIPE = REPO / "recipes" / "sbi" / "sir_custom.yaml"
SIMULATOR = "trainforge.workloads.sbi.examples.sir:simulate"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def physical_cores(cpus: set[int]) -> int | None:
    """Distinct (package, core) pairs among ``cpus``: hyper-threads share a core."""
    pairs = set()
    for cpu in cpus:
        topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
        try:
            package = (topology / "physical_package_id").read_text().strip()
            pairs.add((package, (topology / "core_id").read_text().strip()))
        except OSError:
            return None
    return len(pairs)


def hardware() -> dict[str, Any]:
    cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    usable = len(cpus) if cpus else os.cpu_count()
    return {
        "cpu_model": cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": usable,
        "usable_physical_cores": physical_cores(cpus) if cpus else None,
        "load_average_at_start": list(os.getloadavg()),
        "machine": platform.machine(),
        "system": platform.platform(),
    }


def software() -> dict[str, str]:
    import ray
    import sbi
    import scipy

    return {"python": platform.python_version(), "torch": torch.__version__,
            "ray": ray.__version__, "sbi": sbi.__version__, "scipy": scipy.__version__}  # fmt: skip


def core_counts(usable: int, asked: str | None) -> list[int]:
    """1, all, then 2, 4, …: the ends first, so a run cut short keeps them."""
    if asked:
        return [int(c) for c in asked.split(",")]
    counts, n = [1], 2
    while n < usable:
        counts.append(n)
        n *= 2
    return [1, usable, *counts[1:]] if usable > 1 else [1]


def serial_seconds_per_simulation(samples: int) -> float:
    from trainforge.workloads.sbi.examples import sir

    theta = sir.prior().sample((samples,))
    sir.simulate(theta[:5])  # SciPy's first call imports and warms up
    started = time.perf_counter()
    sir.simulate(theta)
    return (time.perf_counter() - started) / samples


class Writer:
    """The result document, rewritten whole (temporary file, then rename) after each point."""

    def __init__(self, path: Path, document: dict[str, Any]) -> None:
        self.path, self.document = path, document
        path.parent.mkdir(parents=True, exist_ok=True)

    def save(self) -> None:
        temporary = self.path.with_name(f".{self.path.name}.tmp")
        temporary.write_text(json.dumps(self.document, indent=2) + "\n")
        temporary.replace(self.path)


def trainforge_stage(cores: int, simulations: int, warmup: int, scratch: Path) -> dict[str, Any]:
    """The Ray simulation stage on a private Ray of ``cores`` CPUs."""
    import ray

    from trainforge import config
    from trainforge.driver.cluster import connect
    from trainforge.workloads.sbi import simulate

    def section(n: int, folder: Path) -> Any:
        overrides = [f"workload.simulation.num_simulations={n}",
                     f"workload.simulation.cache_dir={folder}", "train.batch_size=8"]  # fmt: skip
        return config.load(RECIPE, overrides).workload

    warmup_section, timed_section = (
        section(warmup, scratch / "warmup"),
        section(simulations, scratch / "timed"),
    )  # the recipe read before any clock starts: a command reads it before its stage
    started = time.perf_counter()
    connect(local_only=True, num_cpus=cores, num_gpus=0)
    ray_start_s = time.perf_counter() - started
    try:
        started = time.perf_counter()
        simulate.run(warmup_section, 1, str(scratch), quiet=True)
        first_call_s = time.perf_counter() - started
        started = time.perf_counter()
        folder = simulate.run(timed_section, 0, str(scratch), quiet=True)
        seconds = time.perf_counter() - started
        manifest = simulate.read_manifest(folder)
    finally:
        ray.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)
    processes = sum(r["processes"] for r in manifest["ran_on"].values())
    return {"seconds": seconds, "ray_start_s": ray_start_s, "first_call_s": first_call_s,
            "chunks": manifest["chunks"], "chunk_size": manifest["chunk_size"],
            "processes": processes, "invalid": manifest["invalid"]}  # fmt: skip


def sbi_joblib(cores: int, simulations: int, warmup: int, batch: int) -> dict[str, Any]:
    from sbi.inference import simulate_for_sbi

    from trainforge.workloads.sbi.examples import sir

    prior = sir.prior()
    started = time.perf_counter()
    simulate_for_sbi(sir.simulate, prior, warmup, num_workers=cores,
                     simulation_batch_size=min(batch, warmup), seed=1,
                     show_progress_bar=False)  # fmt: skip
    first_call_s = time.perf_counter() - started
    started = time.perf_counter()
    _, x = simulate_for_sbi(
        sir.simulate, prior, simulations, num_workers=cores, simulation_batch_size=batch,
        seed=0, show_progress_bar=False,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    assert x.shape == (simulations, 10), x.shape
    return {"seconds": seconds, "first_call_s": first_call_s, "simulation_batch_size": batch}


def _plain_process(theta: Any, barrier: Any, finished: Any) -> None:
    """One of ``plain_processes``' processes: warm up, wait for the others, simulate its part."""
    torch.set_num_threads(1)
    from trainforge.workloads.sbi.examples import sir

    sir.simulate(theta[:2])  # SciPy's first call imports and warms up
    barrier.wait()
    sir.simulate(theta)
    finished.put(time.perf_counter())  # CLOCK_MONOTONIC: one clock for all processes


def plain_processes(cores: int, simulations: int) -> dict[str, Any]:
    """The host's own scaling: ``cores`` new processes, each simulating its share serially."""
    from trainforge.workloads.sbi.examples import sir

    theta = sir.prior().sample((simulations,))
    context = multiprocessing.get_context("spawn")  # nothing of this process's threads
    barrier, finished = context.Barrier(cores + 1), context.Queue()
    started = time.perf_counter()
    processes = [context.Process(target=_plain_process, args=(part, barrier, finished))
                 for part in theta.chunk(cores)]  # fmt: skip
    for process in processes:
        process.start()
    barrier.wait()
    released = time.perf_counter()
    ends = [finished.get(timeout=600) for _ in processes]
    for process in processes:
        process.join()
    return {"seconds": max(ends) - released, "first_call_s": released - started}


def sbi_batch(choice: str, simulations: int, cores: int) -> int:
    """An sbi batch size: a number, or auto (four batches per worker, as a tuned call might)."""
    return max(1, simulations // (4 * cores)) if choice == "auto" else int(choice)


def label(method: str) -> str:
    if method in ("trainforge", "processes"):
        return method
    return "sbi_joblib" if method == "1" else f"sbi_joblib_batch_{method}"


def summarize(document: dict[str, Any]) -> None:
    """Per core count: the median rates, the stage's efficiency against its one-core rate (and
    the plain processes' against theirs: the host's own), the stage's ratio to each sbi variant
    and to the plain processes; then whether the targets were met on what was measured
    (against sbi's best variant at each core count)."""
    measured: dict[tuple[str, int], list[float]] = {}
    for run in document["runs"]:
        measured.setdefault((run["method"], run["cores"]), []).append(run["simulations_per_s"])
    rates = {key: statistics.median(values) for key, values in measured.items()}
    base, host_base = rates.get(("trainforge", 1)), rates.get(("processes", 1))
    rows = []
    for cores in sorted({c for _, c in rates}):
        repeats = len(measured.get(("trainforge", cores), []))
        row: dict[str, Any] = {"cores": cores, "repeats": repeats}
        ours, plain = rates.get(("trainforge", cores)), rates.get(("processes", cores))
        row["trainforge_per_s"] = ours
        row["trainforge_efficiency"] = ours / (cores * base) if ours and base else None
        row["processes_per_s"] = plain
        row["host_efficiency"] = plain / (cores * host_base) if plain and host_base else None
        row["trainforge_over_processes"] = ours / plain if ours and plain else None
        theirs = {m: r for (m, c), r in rates.items() if c == cores and m.startswith("sbi")}
        for method, rate in sorted(theirs.items()):
            row[f"{method}_per_s"] = rate
        row["trainforge_over_best_sbi"] = ours / max(theirs.values()) if ours and theirs else None
        rows.append(row)
    document["summary"] = rows
    efficiencies = [r["trainforge_efficiency"] for r in rows if r["trainforge_efficiency"]]
    ratios = [r["trainforge_over_best_sbi"] for r in rows if r["trainforge_over_best_sbi"]]
    document["targets"] = {
        "scaling_at_least_0.8_of_linear": bool(efficiencies) and min(efficiencies) >= 0.8,
        "min_efficiency": min(efficiencies) if efficiencies else None,
        "at_least_sbi_joblib_at_every_core_count": bool(ratios) and min(ratios) >= 1.0,
        "min_trainforge_over_best_sbi": min(ratios) if ratios else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--out", type=Path, required=True, help="the JSON result, rewritten as it goes")
    add("--cores", help="comma-separated core counts (default 1, 2, 4, … all)")
    add("--seconds", type=float, default=5.0, help="work per point at linear scaling")
    add("--sbi-batch", default="1,auto", help="simulate_for_sbi simulation_batch_size values")
    add("--repeats", type=int, default=1, help="measurements per method and core count")
    add("--no-processes", action="store_true", help="skip the plain processes (static split)")
    add("--budget-s", type=float, default=270.0, help="start no core count ending after this")
    add("--note", default="", help="free text stored with the result")
    args = parser.parse_args()

    started = time.perf_counter()
    machine = hardware()
    cost = serial_seconds_per_simulation(200)
    document: dict[str, Any] = {
        "bench": "sim_scaling", "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": " ".join([Path(sys.executable).name, *sys.argv]), "note": args.note,
        "hardware": machine, "software": software(), "simulator": SIMULATOR,
        "serial_ms_per_simulation": cost * 1e3, "seconds_per_point": args.seconds,
        "runs": [], "complete": False,
    }  # fmt: skip
    writer = Writer(args.out, document)
    writer.save()
    print(f"[bench] {machine['cpu_model']}, {machine['usable_cpus']} usable CPUs; "
          f"serial {cost * 1e3:.2f} ms per simulation", flush=True)  # fmt: skip
    methods = ["trainforge", *args.sbi_batch.split(",")]
    methods += [] if args.no_processes else ["processes"]
    last_point_s = 0.0
    for step, cores in enumerate(core_counts(machine["usable_cpus"], args.cores)):
        elapsed = time.perf_counter() - started
        if elapsed + 1.3 * max(last_point_s, 4 * args.repeats * args.seconds) > args.budget_s:
            document["stopped_early"] = f"budget of {args.budget_s:.0f} s before {cores} cores"
            break
        point_started = time.perf_counter()
        simulations = max(64, round(cores * args.seconds / cost))
        warmup = cores * 64  # four 16-row chunks per core: every worker starts and imports
        # interleaved: the order turns at every core count and every repeat
        for repeat in range(args.repeats):
            order = methods if (step + repeat) % 2 == 0 else methods[::-1]
            for method in order:
                n = simulations
                if method == "trainforge":
                    scratch = Path(tempfile.mkdtemp(prefix="sim_scaling_"))
                    result = trainforge_stage(cores, n, warmup, scratch)
                elif method == "processes":
                    result = plain_processes(cores, n)
                else:
                    result = sbi_joblib(cores, n, warmup, sbi_batch(method, n, cores))
                rate = n / result["seconds"]
                document["runs"].append({"method": label(method), "cores": cores,
                                         "repeat": repeat, "num_simulations": n,
                                         "simulations_per_s": rate, **result})  # fmt: skip
                summarize(document)
                writer.save()
                print(f"[bench] {cores:3d} cores {label(method):24s} {n:8,d} simulations "
                      f"in {result['seconds']:6.2f} s: {rate:9,.0f}/s", flush=True)  # fmt: skip
        last_point_s = time.perf_counter() - point_started
    else:
        document["complete"] = True
    document["wall_s"] = time.perf_counter() - started
    writer.save()
    print(json.dumps(document["targets"], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
