"""Start-up benchmark: where the seconds of a whole `trainforge train` command go.

Each repeat runs, in one invocation on one machine and in this order:
  cold     — no Ray running (the lasting local cluster stopped before): the command trains on
             processes of its own and starts the cluster and its warm workers in the
             background as it ends (driver/background.py); the bench waits for that start
             before the next command, as a user's next command comes later
  cold_ray — the same, TRAINFORGE_WORKERS=warm: the command starts the lasting cluster first
             and trains on its new warm workers
  warm     — the same command again: it connects to that cluster
  private  — TRAINFORGE_WORKERS=own: no cluster kept; the command trains on processes of its
             own and starts nothing afterwards
  private_ray — TRAINFORGE_WORKERS=private: a private Ray started and stopped by the command,
             and Ray Train's new worker group
  raytrain — the cluster up, TRAINFORGE_WORKERS=ray-train: Ray Train's new worker group per run
  address  — a Ray cluster of the bench's own (`ray start --head`, started once) joined through
             RAY_ADDRESS, as `ray job submit` and KubeRay users run: Ray Train's worker group
  baseline — another checkout of trainforge (--baseline DIR holding its `trainforge` package,
             e.g. the commit before the start-up work, with that commit's `recipes/` and
             `deploy/` beside it: shipped recipes are found there), run like `private`
  baseline_cold — that checkout, run like `cold` (the lasting cluster stopped before)
  baseline_warm — that checkout, run like `warm` (after baseline_cold: on the cluster it started)
  baseline_private_ray — that checkout, run like `private_ray` (a Ray Train worker group)
  baseline_address — that checkout, run like `address` (on a cluster of its own, started with
             its package on the Python path)
  resume, baseline_resume — the command just before it again, same run name: a user re-running
             a finished run (since the fifty-second session it says the run's outcome and
             starts no worker, driver/finished_run.py; before, it resumed from the last
             checkpoint, evaluated and checkpointed again)
  torchrun — a hand-written torchrun script (gloo on CPU, NCCL on GPUs) with the same model and
             batch: the anchor for time to the first optimizer step (optional, --torchrun)
  raytrain_script — the same steps as a hand-written Ray Train script (a TorchTrainer) on a
             cluster of the bench's own joined by address, like `address`: what Ray Train itself
             costs (optional, --raytrain-script; --torchrun-procs workers)

With --warmup, one cold command of this checkout runs first, in the invocation's own
TRAINFORGE_HOME, and is recorded apart (``runs["warmup"]``): on GPU hosts the first cold
command of every invocation waited 5-7 s more at its first step, whatever ran before it on the
host (bench/results, thirty-first session), and this keeps that out of the modes' medians.

Every line a command prints is timestamped on arrival; the phases come from trainforge's own
phase lines (ray, mlflow, workers), the first step from `train.log_every_steps=1`, the loop time
from the worker's `finished at step N in X s` line. Worker lines reach the driver through Ray's
log relay, so worker-side times carry its latency (≤ ~0.5 s).

    python bench/startup.py --recipe cnn/digits_simple_cnn --repeats 3 --out results.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

MARKS = {
    "ray": re.compile(r"\[trainforge\] ray: .*\((?P<s>[\d.]+) s\)"),
    "mlflow": re.compile(r"\[trainforge\] mlflow: .*\((?P<s>[\d.]+) s\)"),
    "workers": re.compile(r"\[trainforge\] workers: .*\((?P<s>[\d.]+) s\)"),
    "setup_done": re.compile(r"\[trainforge\] training (\d+ steps|until early stopping)"),
    "first_step": re.compile(r"\[trainforge\] epoch 1(/\d+)? step 1[/ ]"),
    "loop_end": re.compile(r"\[trainforge\] finished at step \d+ in (?P<s>[\d.]+) s"),
    "summary": re.compile(r"\[trainforge\] run '.*' finished in"),
    # the anchors' lines (startup_torchrun_*.py; startup_raytrain_resnet.py's through Ray's
    # log relay, which prefixes the worker's name in colour)
    "anchor_worker": re.compile(r"(^|\)(\x1b\[0m)? )\[anchor\] worker$"),
    "anchor_first_step": re.compile(r"(^|\)(\x1b\[0m)? )\[anchor\] first step"),
}


TIMEOUT_S: float | None = None  # --timeout-s: a command still running then is ended (SIGINT)

# Each mode's setting (TRAINFORGE_WORKERS), and the same for a baseline checkout from before
# that setting (its three switches)
MODE_ENV = {
    "cold_ray": {"TRAINFORGE_WORKERS": "warm", "TRAINFORGE_COLD_WORKERS": "ray"},
    "private": {"TRAINFORGE_WORKERS": "own", "TRAINFORGE_KEEP_CLUSTER": "0"},
    "private_ray": {
        "TRAINFORGE_WORKERS": "private",
        "TRAINFORGE_KEEP_CLUSTER": "0",
        "TRAINFORGE_COLD_WORKERS": "ray",
    },
    "raytrain": {"TRAINFORGE_WORKERS": "ray-train", "TRAINFORGE_WARM_WORKERS": "0"},
}


def timed_command(command: list[str], env: dict[str, str], cwd: Path) -> dict[str, Any]:
    """Run ``command``; the arrival time of each mark (s after start) and its own duration."""
    started = time.perf_counter()
    process = subprocess.Popen(
        command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert process.stdout is not None
    timer = None
    if TIMEOUT_S is not None:  # a Ctrl-C, as a user gives up: the command ends itself
        timer = threading.Timer(TIMEOUT_S, process.send_signal, (signal.SIGINT,))
        timer.start()
    seen: dict[str, Any] = {}
    lines = []
    for line in process.stdout:
        now = time.perf_counter() - started
        lines.append(f"{now:7.2f} {line.rstrip()}")
        for name, pattern in MARKS.items():
            match = pattern.search(line)
            if match and name not in seen:
                seen[name] = round(now, 2)
                if "s" in pattern.groupindex:
                    seen[f"{name}_took_s"] = float(match["s"])
    seen["exit_code"] = process.wait()
    seen["wall_s"] = round(time.perf_counter() - started, 2)
    if timer is not None:
        timer.cancel()
        seen["timed_out"] = seen["wall_s"] >= TIMEOUT_S
    if "loop_end_took_s" in seen:
        seen["overhead_s"] = round(seen["wall_s"] - seen["loop_end_took_s"], 2)
        seen["teardown_s"] = round(seen["wall_s"] - seen["loop_end"], 2)
    if "ray" in seen:
        seen["before_ray_s"] = round(seen["ray"] - seen["ray_took_s"], 2)  # imports, checks
    seen["log_tail"] = lines[-3:] if seen["exit_code"] else []
    return seen


def trainforge_run(recipe: str, name: str, overrides: list[str], env: dict[str, str],
                   cwd: Path) -> dict[str, Any]:  # fmt: skip
    command = [sys.executable, "-m", "trainforge", "train", recipe, f"run.name={name}",
               "train.log_every_steps=1", *overrides]  # fmt: skip
    return timed_command(command, env, cwd)


def spin() -> None:
    while True:
        pass


def settle(env: dict[str, str]) -> None:
    """Wait until a cold command's background start of the cluster and its workers is done."""
    code = "from trainforge.driver import background; background.wait(300)"
    subprocess.run([sys.executable, "-c", code], env=env, timeout=330)


def start_head(ray_cli: list[str], env: dict[str, str],
               *flags: str) -> tuple[subprocess.Popen, dict[str, str]]:  # fmt: skip
    """A Ray head of the bench's own (``ray_cli``: the command that runs Ray's CLI), as a
    `--block` process in a session of its own (ended alone, where `ray stop` would end every
    Ray on the machine): free ports, a temp folder of its own and token auth (a Ray 2.60 client
    hangs in `ray.init` against a head whose auth mode it does not share), up once `ray status`
    answers; its output in the temp folder's ``head.log``. The process, and ``env`` as a client
    joins it with (the auth and RAY_ADDRESS). A dashboard port of its own: a head without one
    still advertises 127.0.0.1:8265 as its API server, and Ray Train's placement-group cleaner
    would then ask whichever Ray owns that port whether our runs' controllers live."""
    import secrets
    import socket

    ports = []
    for _ in range(2):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            ports.append(probe.getsockname()[1])
    port, dashboard = ports
    head_env = {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    temp = Path(tempfile.mkdtemp(prefix="tf-head-", dir="/tmp"))
    with open(temp / "head.log", "w") as log:  # the head keeps its own handle
        head = subprocess.Popen(
            [*ray_cli, "start", "--head", "--block", f"--port={port}",
             "--node-ip-address=127.0.0.1", "--dashboard-host=127.0.0.1",
             f"--dashboard-port={dashboard}", "--dashboard-agent-listen-port=0",
             "--dashboard-agent-grpc-port=0", "--runtime-env-agent-port=0",
             "--metrics-export-port=0", f"--temp-dir={temp}", "--disable-usage-stats", *flags],
            env=head_env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            status = subprocess.run([*ray_cli, "status", f"--address={address}"],
                                    env=head_env, capture_output=True, timeout=30)  # fmt: skip
            if status.returncode == 0:
                return head, {**head_env, "RAY_ADDRESS": address}
        except subprocess.TimeoutExpired:
            pass
        time.sleep(1)
    os.killpg(head.pid, signal.SIGTERM)
    raise RuntimeError(f"the Ray head did not come up in 120 s: {temp / 'head.log'}")


class Heads:
    """The bench's own Ray clusters for the ``address`` modes, one per mode (its package on the
    Python path of every process it starts), started at first use and stopped at the end."""

    def __init__(self, work: Path) -> None:
        self.work, self.started = work, {}

    def env(self, mode: str, env: dict[str, str]) -> dict[str, str]:
        if mode not in self.started:
            ray_cli = [sys.executable, "-m", "trainforge.driver.ray_cli"]  # the mode's package's
            head, joined = start_head(ray_cli, env)
            keys = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN")
            self.started[mode] = (head, {k: joined[k] for k in keys}, joined["RAY_ADDRESS"])
        _, auth, address = self.started[mode]
        return {**env, **auth, "RAY_ADDRESS": address}

    def stop(self) -> None:
        for head, _, _ in self.started.values():
            os.killpg(head.pid, signal.SIGTERM)
            head.wait(timeout=60)


def stop_cluster(env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-m", "trainforge", "cluster", "stop"], env=env,
                   capture_output=True, timeout=120)  # fmt: skip


def run_modes(listed: str | None, baseline: str | None) -> list[str]:
    """The modes to run: those listed, exactly; by default cold, warm and private, and the
    baseline package on a private Ray where one is given."""
    if listed:
        return listed.split(",")
    return ["cold", "warm", "private"] + (["baseline"] if baseline else [])


def write_report(args: argparse.Namespace, runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    medians = {
        mode: {
            key: round(statistics.median(r[key] for r in results if key in r), 2)
            for key in sorted({k for r in results for k in r})
            if all(isinstance(r.get(key), (int, float)) for r in results if key in r)
            and any(key in r for r in results)
        }
        for mode, results in runs.items()
        if results
    }
    report = {
        "machine": {
            "platform": platform.platform(),
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "usable_cpus": len(os.sched_getaffinity(0)),
        },
        "recipe": args.recipe,
        "baseline": args.baseline,
        "overrides": args.overrides,
        "repeats": args.repeats,
        "busy_cores": args.busy,
        "timeout_s": args.timeout_s,
        "medians": medians,
        "runs": runs,
    }
    Path(args.out).write_text(json.dumps(report, indent=1))
    return medians


def with_baseline(env: dict[str, str], folder: str) -> dict[str, str]:
    """``env`` with ``folder`` first on the Python path, before whatever else the environment
    puts there: how every baseline command runs."""
    path = [folder, *filter(None, [env.get("PYTHONPATH")])]
    return {**env, "PYTHONPATH": os.pathsep.join(path)}


def baseline_path(folder: str, env: dict[str, str], cwd: Path) -> str:
    """``folder`` as an absolute path, once a command run like the bench's (from ``cwd``, with
    ``with_baseline``) is seen to import its `trainforge` package. A relative path, taken from
    the bench's commands' temporary folder, named nothing: Python skipped it and the
    "baseline" ran this checkout, as three sessions' device steps did (.base25-27)."""
    wanted = Path(folder).resolve()
    code = "import os, trainforge; print(os.path.realpath(os.path.dirname(trainforge.__file__)))"
    found = subprocess.run([sys.executable, "-c", code], env=with_baseline(env, str(wanted)),
                           cwd=cwd, capture_output=True, text=True, check=False)  # fmt: skip
    package = Path(found.stdout.strip() or "?")
    if found.returncode != 0 or package.parent != wanted:
        raise SystemExit(f"--baseline {folder}: its commands would import trainforge from "
                         f"{package}, not from {wanted}")  # fmt: skip
    return str(wanted)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--recipe", default="cnn/digits_simple_cnn")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--torchrun",
        help="a torchrun script to time as the anchor (bench/startup_torchrun_digits.py on CPU)",
    )
    parser.add_argument("--torchrun-procs", type=int, default=2)
    parser.add_argument(
        "--raytrain-script",
        help="a Ray Train script to time as the anchor of the address modes "
        "(bench/startup_raytrain_resnet.py)",
    )
    parser.add_argument(
        "--baseline", help="a folder holding another `trainforge` package, recipes/ and deploy/"
    )
    parser.add_argument(
        "--fresh-data", action="store_true",
        help="each SBI command simulates anew (its own simulation cache), as a new recipe does",
    )  # fmt: skip
    parser.add_argument("--out", default="startup.json")
    parser.add_argument(
        "--busy",
        type=int,
        default=0,
        help="keep this many cores busy with spinning processes throughout",
    )
    parser.add_argument(
        "--modes",
        help="which of cold, cold_ray, warm, raytrain, private, private_ray, address, baseline, "
        "baseline_cold, baseline_warm, baseline_private_ray, baseline_address, resume, "
        "baseline_resume to run, "
        "in this order (default: cold,warm,private, and baseline with --baseline)",
    )
    parser.add_argument(
        "--timeout-s", type=float, help="end a command still running after this long (SIGINT)"
    )
    parser.add_argument(
        "--warmup", action="store_true",
        help="first one cold command of this checkout, recorded apart as 'warmup'",
    )  # fmt: skip
    parser.add_argument("overrides", nargs="*", default=["train.epochs=2"])
    args = parser.parse_args()
    global TIMEOUT_S
    TIMEOUT_S = args.timeout_s

    work = Path(tempfile.mkdtemp(prefix="tf-startup-"))
    env = {**os.environ, "TRAINFORGE_HOME": str(work / "home"), "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    for name in (
        "TRAINFORGE_WORKERS",
        "TRAINFORGE_KEEP_CLUSTER",
        "TRAINFORGE_COLD_WORKERS",
        "TRAINFORGE_WARM_WORKERS",
    ):
        env.pop(name, None)
    if args.baseline:
        args.baseline = baseline_path(args.baseline, env, work)
    modes = run_modes(args.modes, args.baseline)
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for spinner in spinners:  # a laptop running a simulation in the background
        spinner.start()
    runs: dict[str, list[dict[str, Any]]] = {mode: [] for mode in modes}
    heads = Heads(work)
    listed = (("torchrun", args.torchrun), ("raytrain_script", args.raytrain_script))
    anchors = {name: script for name, script in listed if script}
    for name in anchors:
        runs[name] = []
    if args.warmup:  # untimed for the modes: an invocation's first command waits longer
        stop_cluster(env)
        runs["warmup"] = [trainforge_run(args.recipe, "warmup", list(args.overrides), env, work)]
        settle(env)
        print("warmup", json.dumps(runs["warmup"][0]), flush=True)
    previous_name = "first"  # what a resume mode re-runs
    for repeat in range(args.repeats):
        for position, mode in enumerate(modes):
            mode_env = env
            if mode in ("cold", "cold_ray", "baseline_cold"):
                stop_cluster(env)
            mode_env = {**env, **MODE_ENV.get(mode.removeprefix("baseline_"), {})}
            if mode == "baseline":
                mode_env |= MODE_ENV["private"]
            if mode.startswith("baseline"):
                mode_env = with_baseline(mode_env, args.baseline)
            if mode.endswith("address"):
                mode_env = heads.env(mode, mode_env)
            overrides = list(args.overrides)
            if args.fresh_data:
                overrides.append(f"workload.simulation.cache_dir={work}/data-{mode}{repeat}")
            # a mode named twice in --modes trains a new run each time, never resumes one
            name = f"{mode}{repeat}" + (f"-{position}" if modes.count(mode) > 1 else "")
            if mode.endswith("resume"):
                name = previous_name
            previous_name = name
            result = trainforge_run(args.recipe, name, overrides, mode_env, work)
            if mode in ("cold", "baseline_cold"):  # the next command finds what it started
                settle(env)
            runs[mode].append(result)
            print(mode, json.dumps({k: v for k, v in result.items() if k != "log_tail"}),
                  flush=True)  # fmt: skip
        for name, script in anchors.items():
            script = str(Path(script).resolve())  # the commands run in a temporary folder
            if name == "torchrun":
                command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={args.torchrun_procs}", script]  # fmt: skip
                anchor_env = env
            else:
                command = [sys.executable, script, f"--workers={args.torchrun_procs}"]
                anchor_env = heads.env(name, env)
            result = timed_command(command, anchor_env, work)
            runs[name].append(result)
            print(name, json.dumps(result), flush=True)
        write_report(args, runs)  # what is done so far survives a kill
    stop_cluster(env)
    heads.stop()
    for spinner in spinners:
        spinner.terminate()
    medians = write_report(args, runs)
    for mode, values in medians.items():
        print(mode, values)


if __name__ == "__main__":
    main()
