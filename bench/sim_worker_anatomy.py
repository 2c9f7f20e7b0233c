"""Where a Ray worker's extra simulator seconds go (issue 15, one core): the same SIR
simulations timed in this process and in a Ray task's worker, each with what the process did
meanwhile, and with the suspects switched off one at a time.

``sim_one_core.py`` found a Ray worker simulating at 0.86 of the calling process on a 16-core
host (a fresh process 1.03), and niceness did not explain it. Each call here reports, from the
process doing the work: wall, the simulating thread's CPU seconds, the CPU seconds of the
process's other threads, the garbage collector's collections and seconds, the thread's
context switches and minor page faults, and the CPUs it ran on. Variants, in turn:

  plain      — as the stage's chunk runs
  gc_off     — the collector disabled for the call
  gc_frozen  — ``gc.freeze()`` first: the process's objects moved out of the collector's reach
  switch_1s  — ``sys.setswitchinterval(1.0)``: another Python thread cannot take the GIL
               from the simulating one every 5 ms

and, ``plain``, in a fresh process started by this process (``subprocess``) and by the Ray
worker (``ray_subprocess``: the worker's niceness, CPUs and environment, not its heap).

Once per process: tracked objects, threads (OS and Python), the collector's thresholds,
niceness, CPUs allowed, allocator libraries mapped, and environment settings that change
numerical or allocator behaviour.

    python bench/sim_worker_anatomy.py --out anatomy.json [--simulations 1000] [--rounds 6]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

os.environ["OMP_NUM_THREADS"] = "1"

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from sim_one_core import child_says, one_core_setup
from sim_scaling import hardware, software

# a fresh process: imports torch and this file, times one plain call as ``measured`` does
CHILD = """
import json, sys, torch
sys.path.insert(0, sys.argv[1])
from sim_worker_anatomy import measured
print(json.dumps(measured(torch.load(sys.argv[2]), "plain")))
"""
VARIANTS = ("plain", "gc_off", "gc_frozen", "switch_1s")
ENV_PREFIXES = ("PYTHON", "MALLOC", "LD_", "OMP", "MKL", "OPENBLAS", "RAY_worker", "GLIBC")


def _thread_cpus() -> dict[str, float]:
    """CPU seconds of each OS thread of this process, by thread id."""
    tick = os.sysconf("SC_CLK_TCK")
    seconds = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        seconds[tid] = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
    return seconds


def _on_cpu() -> int:
    return int(Path("/proc/thread-self/stat").read_text().rsplit(")", 1)[1].split()[36])


def facts() -> dict[str, Any]:
    """What this process is, once."""
    maps = Path("/proc/self/maps").read_text()
    return {
        "pid": os.getpid(),
        "tracked_objects": len(gc.get_objects()),
        "gc_threshold": gc.get_threshold(),
        "gc_frozen_before": gc.get_freeze_count(),
        "switch_interval_s": sys.getswitchinterval(),
        "os_threads": len(os.listdir("/proc/self/task")),
        "python_threads": [t.name for t in threading.enumerate()],
        "niceness": os.getpriority(os.PRIO_PROCESS, 0),
        "cpus_allowed": len(os.sched_getaffinity(0)),
        "allocators_mapped": sorted(
            {line.split()[-1] for line in maps.splitlines() if "malloc" in line.split()[-1]}
        ),
        "modules": len(sys.modules),
        "trace": repr(sys.gettrace()),
        "profile": repr(sys.getprofile()),
        # Python 3.12's sys.monitoring (3.11 has none)
        "monitoring_tools": [m.get_tool(i) for i in range(6)]
        if (m := getattr(sys, "monitoring", None))
        else None,
        "perf_trampoline": getattr(sys, "is_stack_trampoline_active", lambda: None)(),
        "env": {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIXES)},
    }


def measured(theta: torch.Tensor, variant: str) -> dict[str, Any]:
    """One timed ``sir.simulate(theta)`` in the calling process, under ``variant``."""
    from trainforge.workloads.sbi.examples import sir

    sir.simulate(theta[:4])  # SciPy's first solve imports and warms up
    collector_s = [0.0]
    began_collecting = [0.0]

    def timed_collection(phase: str, _info: dict[str, Any]) -> None:
        if phase == "start":
            began_collecting[0] = time.perf_counter()
        else:
            collector_s[0] += time.perf_counter() - began_collecting[0]

    switch = sys.getswitchinterval()
    if variant == "gc_off":
        gc.disable()
    elif variant == "gc_frozen":
        gc.freeze()
    elif variant == "switch_1s":
        sys.setswitchinterval(1.0)
    gc.callbacks.append(timed_collection)
    collections = [g["collections"] for g in gc.get_stats()]
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    others = _thread_cpus()
    cpu_first = _on_cpu()
    began, thread_began = time.perf_counter(), time.thread_time()
    try:
        sir.simulate(theta)
    finally:
        wall, thread_cpu = time.perf_counter() - began, time.thread_time() - thread_began
        cpu_last = _on_cpu()
        others_after = _thread_cpus()
        usage_after = resource.getrusage(resource.RUSAGE_THREAD)
        stats = gc.get_stats()
        collections = [g["collections"] - c for g, c in zip(stats, collections, strict=True)]
        gc.callbacks.remove(timed_collection)
        gc.enable()
        gc.unfreeze()
        sys.setswitchinterval(switch)
    me = str(threading.get_native_id())
    other_threads_cpu = sum(
        s - others.get(tid, 0.0) for tid, s in others_after.items() if tid != me
    )
    return {
        "wall_s": wall,
        "thread_cpu_s": thread_cpu,
        "other_threads_cpu_s": other_threads_cpu,
        "collections": collections,
        "collector_s": collector_s[0],
        "voluntary_switches": usage_after.ru_nvcsw - usage.ru_nvcsw,
        "involuntary_switches": usage_after.ru_nivcsw - usage.ru_nivcsw,
        "minor_faults": usage_after.ru_minflt - usage.ru_minflt,
        "cpus": [cpu_first, cpu_last],
    }


def in_subprocess(theta_file: Path) -> dict[str, Any]:
    """``measured(θ, "plain")`` in a fresh process started by the calling one."""
    return json.loads(child_says(CHILD, theta_file))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--simulations", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()

    import ray

    theta, theta_file = one_core_setup(args.simulations)
    remote_measured = ray.remote(num_cpus=1)(measured)
    remote_facts = ray.remote(num_cpus=1)(facts)
    kinds = {f"here_{v}": (lambda v=v: measured(theta, v)) for v in ("plain", "gc_off")}
    kinds |= {f"ray_{v}": (lambda v=v: ray.get(remote_measured.remote(theta, v))) for v in VARIANTS}
    kinds["subprocess"] = lambda: in_subprocess(theta_file)
    remote_subprocess = ray.remote(num_cpus=1)(in_subprocess)
    kinds["ray_subprocess"] = lambda: ray.get(remote_subprocess.remote(theta_file))
    order = list(kinds)
    calls: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    try:
        ray.get(remote_measured.remote(theta[:8], "plain"))  # the worker started and warm
        report: dict[str, Any] = {
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "hardware": hardware(), "software": software(), "simulations": args.simulations,
            "process_facts": {"here": facts(), "ray": ray.get(remote_facts.remote())},
        }  # fmt: skip
        for round_ in range(args.rounds):
            turn = order[round_ % len(order) :] + order[: round_ % len(order)]
            for kind in turn:
                calls[kind].append(kinds[kind]())
            print(f"[anatomy] round {round_ + 1}: " + ", ".join(
                f"{k} {calls[k][-1]['wall_s']:.2f} s" for k in turn), flush=True)  # fmt: skip
    finally:
        ray.shutdown()
    here = statistics.median(c["wall_s"] for c in calls["here_plain"])
    summary = {}
    medians = ("thread_cpu_s", "other_threads_cpu_s", "collector_s", "involuntary_switches",
               "voluntary_switches", "minor_faults")  # fmt: skip
    for kind, made in calls.items():
        wall = statistics.median(c["wall_s"] for c in made)
        summary[kind] = {
            "simulations_per_s": args.simulations / wall,
            "rate_of_here_plain": here / wall,
            **{key: statistics.median(c[key] for c in made) for key in medians},
            "collections_per_call": [
                statistics.median(c["collections"][g] for c in made) for g in range(3)
            ],
        }
    report |= {"calls": calls, "summary": summary}
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report["process_facts"], indent=1))
    for kind, row in summary.items():
        print(f"[anatomy] {kind:14s} {row['simulations_per_s']:7.1f}/s "
              f"({row['rate_of_here_plain']:.3f} of here) thread cpu {row['thread_cpu_s']:.2f} s, "
              f"others {row['other_threads_cpu_s']:.2f} s, gc {row['collector_s']:.3f} s "
              f"{row['collections_per_call']}, invol {row['involuntary_switches']:.0f}, "
              f"faults {row['minor_faults']:.0f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
