"""Where a `trainforge train` command's seconds go before its first step, process by process.

Runs the command once per mode and samples, every ``--interval`` seconds, the Python stacks of
the command and of every Python process started meanwhile (Ray Train's controller, its
synchronization actor, its workers, the preemption watcher; the command's own workers) with
``py-spy dump --nonblocking``. Each process's samples are folded into phases — runs of samples
in the same place: the innermost trainforge frame and the innermost frame — with their start and
end (seconds since the command's start), beside the command's own timestamped lines.

  cold     the command's own processes (``TRAINFORGE_WORKERS=own``)
  address  Ray Train's worker group on a cluster of the bench's own joined through RAY_ADDRESS
           (``startup.Heads``), as `ray job submit` and KubeRay users run

Needs py-spy (``pip install py-spy``; a wheel beside the device bundle on the GPU machine).

    python bench/start_timeline.py --recipe cnn/synthetic_resnet18_bench --modes cold,address \\
        --out timeline.json train.max_steps=40
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import Heads  # bench/ is a folder of scripts

FIRST_STEP = "epoch 1"  # with train.log_every_steps=1, the first step's line


def python_pids(before: set[int]) -> dict[int, str]:
    """Python processes that were not running before the command, with their titles (Ray's
    actors title themselves ``ray::ClassName``)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in before:
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if ("python" in cmdline or cmdline.startswith("ray::")) and not any(
            part in cmdline for part in NOT_THE_RUNS
        ):
            found[int(entry.name)] = cmdline[:120]
    return found


NOT_THE_RUNS = ("py-spy", "ray-dashboard", "dashboard/", "log_monitor", "resource_tracker",
                "forkserver", "ray::IDLE", "ray::DashboardAgent",
                "ray::RuntimeEnvAgent")  # fmt: skip
"""The cluster's own processes, which a head starts whatever runs on it."""


def place(pid: int) -> str | None:
    """Where the process is now: its most telling thread's innermost trainforge frame and its
    innermost frame (``idle`` where no thread runs Python)."""
    done = subprocess.run(["py-spy", "dump", "--json", "--nonblocking", "--pid", str(pid)],
                          capture_output=True, text=True, timeout=10)  # fmt: skip
    if done.returncode != 0:
        return None
    try:
        threads = json.loads(done.stdout)
    except ValueError:
        return None

    def rank(thread: dict[str, Any]) -> tuple[bool, bool, bool]:
        ours = any("trainforge" in frame["filename"] for frame in thread["frames"])
        return ours, thread["active"], thread["thread_name"] == "MainThread"

    thread = max(threads, key=rank, default=None)
    if thread is None or not thread["frames"]:
        return "idle"
    frames = thread["frames"]  # innermost first

    def name(frame: dict[str, Any]) -> str:
        return f"{frame['name']} ({frame['short_filename']}:{frame['line']})"

    ours = next((name(f) for f in frames if "trainforge" in f["filename"]), "")
    state = "" if thread["active"] else "idle in "
    return f"{ours} | {state}{name(frames[0])}" if ours else f"{state}{name(frames[0])}"


def sample(command: list[str], env: dict[str, str], cwd: Path, interval: float,
           timeout_s: float) -> dict[str, Any]:  # fmt: skip
    """Run ``command``; its lines and every new Python process's places, timestamped."""
    before = set(python_pids(set()))
    started = time.perf_counter()
    process = subprocess.Popen(command, env=env, cwd=cwd, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)  # fmt: skip
    lines: list[tuple[float, str]] = []
    done = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.append((round(time.perf_counter() - started, 2), line.rstrip()[:200]))
            if FIRST_STEP in line:
                done.set()
        done.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    titles: dict[int, str] = {}
    samples: dict[int, list[tuple[float, str]]] = {}
    with ThreadPoolExecutor(max_workers=8) as pool:
        while not done.is_set() and time.perf_counter() - started < timeout_s:
            now = round(time.perf_counter() - started, 2)
            found = python_pids(before)
            titles.update({pid: title for pid, title in found.items() if pid not in titles
                           or title.startswith("ray::")})  # fmt: skip
            for pid, where in zip(found, pool.map(place, found), strict=True):
                if where is not None:
                    samples.setdefault(pid, []).append((now, where))
            time.sleep(max(0.0, interval - (time.perf_counter() - started - now)))
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
    reader.join(timeout=10)
    return {
        "exit_code": process.returncode,
        "lines": lines,
        "processes": {
            str(pid): {"title": titles.get(pid, ""), "phases": phases(samples[pid])}
            for pid in sorted(samples, key=lambda pid: samples[pid][0][0])
        },
    }


def phases(samples: list[tuple[float, str]]) -> list[tuple[float, float, str]]:
    """Consecutive samples in the same place, as (first seen, last seen, place)."""
    folded: list[tuple[float, float, str]] = []
    for at, where in samples:
        if folded and folded[-1][2] == where:
            folded[-1] = (folded[-1][0], at, where)
        else:
            folded.append((at, at, where))
    return folded


def report(mode: str, run: dict[str, Any]) -> str:
    out = [f"== {mode} (exit {run['exit_code']})"]
    out += [f"  {at:7.2f}  {line}" for at, line in run["lines"] if "[trainforge]" in line][:12]
    for pid, process in run["processes"].items():
        out.append(f"  -- pid {pid} {process['title']}")
        out += [f"    {start:7.2f}-{end:7.2f}  {where}" for start, end, where in process["phases"]]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipe", default="cnn/digits_simple_cnn")
    parser.add_argument("--modes", default="cold,address")
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument("--timeout-s", type=float, default=150)
    parser.add_argument("--out", default="timeline.json")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    if shutil.which("py-spy") is None:
        sys.exit("start_timeline: py-spy is not on PATH (pip install py-spy)")
    work = Path(tempfile.mkdtemp(prefix="tf-timeline-"))
    env = {**os.environ, "TRAINFORGE_HOME": str(work / "home"), "OMP_NUM_THREADS": "1"}
    for name in [key for key in env if key.startswith("TRAINFORGE_WORKERS")] + ["RAY_ADDRESS"]:
        env.pop(name, None)
    heads = Heads(work)
    runs = {}
    try:
        for mode in args.modes.split(","):
            mode_env = (
                {**env, "TRAINFORGE_WORKERS": "own"}
                if mode == "cold"
                else heads.env("address", env)
            )
            command = [sys.executable, "-m", "trainforge", "train", args.recipe,
                       f"run.name={mode}", "train.log_every_steps=1", *args.overrides]  # fmt: skip
            time.sleep(3)  # a head just started finishes starting its own processes
            runs[mode] = sample(command, mode_env, work, args.interval, args.timeout_s)
            print(report(mode, runs[mode]), flush=True)
    finally:
        heads.stop()
    Path(args.out).write_text(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
