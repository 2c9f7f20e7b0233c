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
               joblib's workers and a task on each of them (each imports the simulator).
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
With ``--pin``, each method's simulating processes share one fixed set of CPUs at each core count
(N CPUs on distinct physical cores where the host says which those are, taken from the end of
the list), and everything else — this process between measurements, Ray's own processes,
joblib's parent — runs on the other CPUs. On a VM whose vCPUs run at unequal speeds from
moment to moment, unpinned methods land on different CPUs, and one-core rates jump between
levels; pinned, every method simulates on the same CPUs.
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


def core_of(cpu: int) -> tuple[str, str] | None:
    """The (package, core) pair of ``cpu`` (hyper-threads share one), None where unknown."""
    topology = Path(f"/sys/devices/system/cpu/cpu{cpu}/topology")
    try:
        return ((topology / "physical_package_id").read_text().strip(),
                (topology / "core_id").read_text().strip())  # fmt: skip
    except OSError:
        return None


def physical_cores(cpus: set[int]) -> int | None:
    """Distinct (package, core) pairs among ``cpus``: hyper-threads share a core."""
    pairs = {core_of(cpu) for cpu in cpus}
    return None if None in pairs else len(pairs)


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


def pinned_cpus(cores: int) -> tuple[set[int], set[int]]:
    """The CPUs the simulating processes get at ``cores`` (one per physical core where the host
    says which those are, from the end of the list: CPU 0 takes most interrupts), and the rest
    for everything else; all CPUs for both when ``cores`` takes them all."""
    usable = sorted(os.sched_getaffinity(0))
    if cores >= len(usable):
        return set(usable), set(usable)
    chosen: list[int] = []
    seen_cores: set[tuple[str, str]] = set()
    for cpu in reversed(usable):
        core = core_of(cpu) or ("", str(cpu))
        if core not in seen_cores:
            seen_cores.add(core)
            chosen.append(cpu)
        if len(chosen) == cores:
            break
    for cpu in reversed(usable):  # fewer physical cores than asked: hyper-threads too
        if len(chosen) < cores and cpu not in chosen:
            chosen.append(cpu)
    return set(chosen), set(usable) - set(chosen)


def descendants() -> list[tuple[int, str]]:
    """(pid, command line) of every process below this one, read from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:  # the command name in stat may hold spaces and parentheses: split after it
                parents[int(entry.name)] = int(
                    (entry / "stat").read_text().rsplit(")", 1)[1].split()[1]
                )
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [os.getpid()]
    while frontier:
        parent = frontier.pop()
        for pid, ppid in parents.items():
            if ppid == parent:
                frontier.append(pid)
                try:
                    command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                except OSError:
                    continue
                found.append((pid, command.decode(errors="replace").strip()))
    return found


def pin_simulators(simulating: set[int], rest: set[int], is_simulator: Any) -> list[int]:
    """Every descendant that ``is_simulator`` (by command line) to ``simulating``, every other
    one to ``rest``; returns the pinned simulators' pids."""
    pinned = []
    for pid, command in descendants():
        simulator = is_simulator(command)
        # an affinity belongs to a thread: every thread of the process, or Ray's other
        # threads (its own, gRPC's) would still run on the simulating CPUs
        for thread in threads(pid):
            try:
                os.sched_setaffinity(thread, simulating if simulator else rest)
            except OSError:  # gone meanwhile
                continue
        if simulator:
            pinned.append(pid)
    return pinned


def threads(pid: int) -> list[int]:
    try:
        return [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return []


def ray_worker(command: str) -> bool:
    return command.startswith("ray::")


def off_cpus(pids: list[int], cpus: set[int]) -> int:
    """How many of ``pids`` (still alive) are not restricted to ``cpus``."""
    off = 0
    for pid in pids:
        try:
            off += any(os.sched_getaffinity(t) != cpus for t in threads(pid))
        except OSError:
            continue
    return off


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


def stage_section(n: int, folder: Path) -> Any:
    """The SIR recipe's workload section for a stage of ``n`` simulations cached in ``folder``."""
    from trainforge import config

    overrides = [f"workload.simulation.num_simulations={n}",
                 f"workload.simulation.cache_dir={folder}", "train.batch_size=8"]  # fmt: skip
    return config.load(RECIPE, overrides).workload


def trainforge_stage(
    cores: int, simulations: int, warmup: int, scratch: Path, pin: bool, nice0: bool = False
) -> dict[str, Any]:
    """The Ray simulation stage on a private Ray of ``cores`` CPUs; pinned, Ray starts on the
    other CPUs and its workers move to the simulating ones after the warm-up call. ``nice0``:
    Ray's workers at niceness 0 instead of Ray's 15 (``RAY_worker_niceness``, read by the
    raylet this process starts)."""
    import ray

    from trainforge.driver.cluster import connect
    from trainforge.driver.stage import Runner
    from trainforge.workloads.sbi import simulate, simulations

    warmup_section, timed_section = (
        stage_section(warmup, scratch / "warmup"),
        stage_section(simulations, scratch / "timed"),
    )  # the recipe read before any clock starts: a command reads it before its stage
    simulating, rest = pinned_cpus(cores)
    if pin:
        os.sched_setaffinity(0, rest)  # Ray's processes inherit it
    if nice0:
        os.environ["RAY_worker_niceness"] = "0"  # noqa: SIM112 - Ray spells it so
    started = time.perf_counter()
    connect(local_only=True, num_cpus=cores, num_gpus=0)
    ray_start_s = time.perf_counter() - started
    os.environ.pop("RAY_worker_niceness", None)
    try:
        started = time.perf_counter()
        simulate.run(warmup_section, 1, str(scratch), Runner(), quiet=True)
        first_call_s = time.perf_counter() - started
        pinned = pin_simulators(simulating, rest, ray_worker) if pin else []
        started = time.perf_counter()
        folder = simulate.run(timed_section, 0, str(scratch), Runner(), quiet=True)
        seconds = time.perf_counter() - started
        manifest = simulations.read_manifest(folder)
        # a worker Ray started after the pinning runs on the other CPUs: say so
        workers = [pid for pid, command in descendants() if ray_worker(command)]
        unpinned = off_cpus(workers, simulating) if pin else None
        niceness = sorted({os.getpriority(os.PRIO_PROCESS, pid) for pid in workers})
    finally:
        ray.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)
        os.sched_setaffinity(0, simulating | rest)
    processes = sum(r["processes"] for r in manifest["ran_on"].values())
    return {"seconds": seconds, "ray_start_s": ray_start_s, "first_call_s": first_call_s,
            "chunks": manifest["chunks"], "chunk_size": manifest["chunk_size"],
            "processes": processes, "invalid": manifest["invalid"],
            "pinned_workers": len(pinned), "workers_off_pinned_cpus": unpinned,
            "worker_niceness": niceness}  # fmt: skip


def sbi_joblib(cores: int, simulations: int, warmup: int, batch: int, pin: bool) -> dict[str, Any]:
    """sbi's call; pinned, joblib's workers (and this process, which simulates itself at
    ``num_workers=1``) run on the simulating CPUs for the call."""
    from sbi.inference import simulate_for_sbi

    from trainforge.workloads.sbi.examples import sir

    simulating, rest = pinned_cpus(cores)
    if pin:
        os.sched_setaffinity(0, simulating)
    prior = sir.prior()
    started = time.perf_counter()
    simulate_for_sbi(sir.simulate, prior, warmup, num_workers=cores,
                     simulation_batch_size=min(batch, warmup), seed=1,
                     show_progress_bar=False)  # fmt: skip
    warmed = warm_joblib_workers(cores) if cores > 1 else 1
    first_call_s = time.perf_counter() - started
    if pin:  # loky keeps its workers between calls: those from an earlier core count too
        pin_simulators(simulating, rest, lambda command: True)
    started = time.perf_counter()
    _, x = simulate_for_sbi(
        sir.simulate, prior, simulations, num_workers=cores, simulation_batch_size=batch,
        seed=0, show_progress_bar=False,
    )  # fmt: skip
    seconds = time.perf_counter() - started
    os.sched_setaffinity(0, simulating | rest)
    assert x.shape == (simulations, 10), x.shape
    return {"seconds": seconds, "first_call_s": first_call_s, "simulation_batch_size": batch,
            "warm_joblib_workers": warmed}  # fmt: skip


def warm_joblib_workers(cores: int) -> int:
    """How many of joblib's ``cores`` workers simulated before the timed call. sbi's warm-up
    call alone leaves most of them idle (at the tuned batch size it has fewer batches than
    workers), and an idle one imports torch and the simulator inside the timed call: the
    forty-eighth session's first sbi call at each core count took up to twice its second. Each
    warm task holds its worker for a second, so the tasks spread over all of them."""
    from joblib import Parallel, delayed

    pids: set[int] = set()
    for _ in range(3):  # a worker still starting may miss a round; the next one finds it
        pids |= set(Parallel(n_jobs=cores)(delayed(_warm_joblib_worker)() for _ in range(cores)))
        if len(pids) >= cores:
            break
    return len(pids)


def _warm_joblib_worker() -> int:
    from trainforge.workloads.sbi.examples import sir

    sir.simulate(sir.prior().sample((2,)))
    time.sleep(1.0)
    return os.getpid()


def _plain_process(theta: Any, barrier: Any, finished: Any) -> None:
    """One of ``plain_processes``' processes: warm up, wait for the others, simulate its part."""
    torch.set_num_threads(1)
    from trainforge.workloads.sbi.examples import sir

    sir.simulate(theta[:2])  # SciPy's first call imports and warms up
    barrier.wait()
    sir.simulate(theta)
    finished.put(time.perf_counter())  # CLOCK_MONOTONIC: one clock for all processes


def plain_processes(cores: int, simulations: int, pin: bool) -> dict[str, Any]:
    """The host's own scaling: ``cores`` new processes, each simulating its share serially;
    pinned, they share the simulating CPUs."""
    from trainforge.workloads.sbi.examples import sir

    theta = sir.prior().sample((simulations,))
    context = multiprocessing.get_context("spawn")  # nothing of this process's threads
    barrier, finished = context.Barrier(cores + 1), context.Queue()
    started = time.perf_counter()
    processes = [context.Process(target=_plain_process, args=(part, barrier, finished))
                 for part in theta.chunk(cores)]  # fmt: skip
    for process in processes:
        process.start()
    if pin:
        simulating, _ = pinned_cpus(cores)
        for process in processes:
            for thread in threads(process.pid):
                os.sched_setaffinity(thread, simulating)
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
    if method in ("trainforge", "trainforge_nice0", "processes"):
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
    add("--pin", action="store_true", help="each method's simulators on the same CPUs")
    add("--nice0", action="store_true", help="the stage also with Ray's workers at niceness 0")
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
        "pinned": args.pin,
        "runs": [], "complete": False,
    }  # fmt: skip
    writer = Writer(args.out, document)
    writer.save()
    print(f"[bench] {machine['cpu_model']}, {machine['usable_cpus']} usable CPUs; "
          f"serial {cost * 1e3:.2f} ms per simulation", flush=True)  # fmt: skip
    methods = ["trainforge", *(["trainforge_nice0"] if args.nice0 else []),
               *args.sbi_batch.split(",")]  # fmt: skip
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
                if method.startswith("trainforge"):
                    scratch = Path(tempfile.mkdtemp(prefix="sim_scaling_"))
                    nice0 = method == "trainforge_nice0"
                    result = trainforge_stage(cores, n, warmup, scratch, args.pin, nice0)
                elif method == "processes":
                    result = plain_processes(cores, n, args.pin)
                else:
                    result = sbi_joblib(cores, n, warmup, sbi_batch(method, n, cores), args.pin)
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
