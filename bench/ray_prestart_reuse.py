"""Does an actor take one of the idle worker processes Ray starts ahead for a new driver, or wait
for a new process? Each case joins a fresh head by address (``bench/startup.Heads``), waits for
the idle workers, then times one actor's first call:

- ``plain``: no runtime env on the driver's job nor on the actor;
- ``job_env``: ``ray.init(runtime_env={"env_vars": ...})``, as a command joining by address
  pins RAY_ADDRESS for its tasks;
- ``actor_env``: an actor with ``runtime_env={"env_vars": ...}``, as Ray Train gives its
  controller and its workers (``get_env_vars_to_propagate``);
- ``same_env``: both, the actor's variables also in the job's (the merged env equals the job's);
- ``warmed``, ``warmed_2s``: the actor of ``actor_env``, after a task with the same runtime env
  ran to its end (0.2 s and 2 s before): does the actor take the process the task left idle?
  (Ray kills idle workers above its soft limit, the node's CPUs, after 1 s.)

Usage (repo root): python bench/ray_prestart_reuse.py --repeats 3 --out reuse.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from startup import Heads

CASES = ("plain", "job_env", "actor_env", "same_env", "warmed", "warmed_2s")
WARMED_AFTER_S = {"warmed": 0.2, "warmed_2s": 2.0}
ACTOR_ENV = {"RAY_WARN_BLOCKING_GET_INSIDE_ASYNC": "0"}


def idle_workers() -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                if b"ray::IDLE" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.append(int(pid))
            except OSError:
                pass
    return found


def one_case(case: str) -> dict[str, object]:
    """In this process: join the head in RAY_ADDRESS, time the actor."""
    import ray

    job_env = {"RAY_ADDRESS_PINNED": "1"} | (ACTOR_ENV if case == "same_env" else {})
    with_job_env = case in ("job_env", "same_env")
    ray.init(address=os.environ["RAY_ADDRESS"],
             runtime_env={"env_vars": job_env} if with_job_env else None)  # fmt: skip
    time.sleep(4)  # the idle workers started for this driver are up

    @ray.remote(num_cpus=0)
    class Probe:
        def pid(self) -> int:
            return os.getpid()

    @ray.remote(num_cpus=0)
    def warm() -> int:
        return os.getpid()

    warmed_pid = None
    if case in WARMED_AFTER_S:
        warmed_pid = ray.get(warm.options(runtime_env={"env_vars": ACTOR_ENV}).remote())
        time.sleep(WARMED_AFTER_S[case])
    idle = idle_workers()
    started = time.monotonic()
    if case in ("actor_env", "same_env", *WARMED_AFTER_S):
        actor = Probe.options(runtime_env={"env_vars": ACTOR_ENV}).remote()
    else:
        actor = Probe.remote()
    pid = ray.get(actor.pid.remote())
    took = time.monotonic() - started
    ray.shutdown()
    return {"case": case, "actor_s": round(took, 3), "took_an_idle_worker": pid in idle,
            "idle_workers": len(idle), "took_the_warmed_process": pid == warmed_pid}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    parser.add_argument("--case", choices=CASES, help=argparse.SUPPRESS)  # one case, in a child
    args = parser.parse_args()
    if args.case:
        print(json.dumps(one_case(args.case)))
        return
    results = []
    for _ in range(args.repeats):
        for case in args.cases:
            heads = Heads(Path(tempfile.mkdtemp(prefix="tf-reuse-")))
            env = heads.env(case, dict(os.environ))
            done = subprocess.run([sys.executable, __file__, "--case", case, "--out", "-"],
                                  env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
            for head, _, _ in heads.started.values():
                os.killpg(head.pid, signal.SIGKILL)  # its own session: the head and its node
            result = json.loads(done.stdout.strip().splitlines()[-1])
            results.append(result)
            print(json.dumps(result), flush=True)
    summary = {
        case: {
            "actor_s_median": sorted(r["actor_s"] for r in results if r["case"] == case)[
                args.repeats // 2
            ],
            "took_an_idle_worker": [r["took_an_idle_worker"] for r in results if r["case"] == case],
        }
        for case in args.cases
    }
    args.out.write_text(json.dumps({"machine": platform.platform(), "cpus": os.cpu_count(),
                                    "results": results, "summary": summary}, indent=1))  # fmt: skip
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
