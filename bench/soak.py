"""Soak: many real runs, each with a random fault, then the same command again.

Each round runs the digits recipe (2 workers, 3 epochs, augmentation on) as a real
``trainforge train`` command on one worker group (the command's own processes, the lasting
local cluster's warm workers in a home of this soak's own, or Ray Train's worker group on a
cluster of the soak's own joined by RAY_ADDRESS: ``ray-train``), causes one fault, then runs
the same command again, and checks what a user keeps:

- the second command ends with exit 0 and the uninterrupted run's final weights, bitwise;
- one MLflow run of that name, FINISHED, with one value per step of every metric;
- no worker process of the round left running its loop;
- a secret planted in the environment in no file of the round's folder or the home.

Faults: ``worker-kill`` (SIGKILL of rank 0's process in epoch 2), ``command-kill`` (SIGKILL of
the command in epoch 2), ``ctrl-c`` (SIGINT to the command in epoch 2), ``disk-full`` (ENOSPC
part-way through rank 0's second checkpoint, from the tests' fault plugin), ``corrupt-newest``
(the command SIGKILLed in epoch 3, then a byte of its newest checkpoint flipped: the resume
falls back to the one before).

    python bench/soak.py --rounds 20 --seed 1 --out bench/results/soak.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from mlflow.tracking import MlflowClient

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
from startup import Heads  # noqa: E402  # the cluster joined by address

from tests import faults  # noqa: E402  # the tests' worker plugin: the disk-full fault
from trainforge import checkpoint  # noqa: E402

DIGITS = REPO / "recipes" / "cnn" / "digits_simple_cnn.yaml"
COMMON = ["scaling.num_workers=2", "train.epochs=3", "train.batch_size=8",
          "workload.augment=true", "tracking.system_metrics=false"]  # fmt: skip
FAULTS = ("worker-kill", "command-kill", "ctrl-c", "disk-full", "corrupt-newest")
SECRET = "soak-planted-3e9d71"
RANK_0_STEP = (
    r"\((?:TrainforgeWorker rank=0|RayTrainWorker) (\d+)\) \[trainforge\] epoch {epoch}/3 step"
)
JOINED: dict[str, str] = {}
"""The address and token of the soak's own cluster, for the ``ray-train`` rounds."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--groups", default="own,warm", help="worker groups to draw from")
    parser.add_argument("--faults", default=",".join(FAULTS), help="faults to draw from")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    draw = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="trainforge-soak-") as scratch:
        root = Path(scratch)
        heads = Heads(root)
        if "ray-train" in args.groups.split(","):
            JOINED.update(heads.env("address", {}))
        reference = uninterrupted(root)
        rounds = []
        for number in range(args.rounds):
            fault = draw.choice(args.faults.split(","))
            group = draw.choice(args.groups.split(","))
            began = time.monotonic()
            result = one_round(root, number, fault, group, reference)
            result |= {"round": number, "fault": fault, "group": group,
                       "seconds": round(time.monotonic() - began, 1)}  # fmt: skip
            print(json.dumps(result), flush=True)
            rounds.append(result)
        subprocess.run([sys.executable, "-m", "trainforge", "cluster", "stop"],
                       env=environment(root, "warm"), capture_output=True, timeout=120)  # fmt: skip
        heads.stop()
    passed = sum(r["ok"] for r in rounds)
    args.out.write_text(json.dumps({
        "machine": platform.platform(), "cpus": os.cpu_count(), "seed": args.seed,
        "passed": passed, "rounds": rounds,
    }, indent=1) + "\n")  # fmt: skip
    print(f"{passed} of {len(rounds)} rounds kept everything")
    return 0 if passed == len(rounds) else 1


def environment(root: Path, group: str, **asked: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "TRAINFORGE_"))}
    env |= {"TRAINFORGE_HOME": str(root / "home"), "OMP_NUM_THREADS": "1",
            "AWS_SECRET_ACCESS_KEY": SECRET}  # fmt: skip
    env |= JOINED if group == "ray-train" else {"TRAINFORGE_WORKERS": group}
    return faults.env(env, **asked) if asked else env


def command(name: str) -> list[str]:
    return [sys.executable, "-m", "trainforge", "train", str(DIGITS), *COMMON, f"run.name={name}"]


def uninterrupted(root: Path) -> dict[str, torch.Tensor]:
    folder = root / "reference"
    folder.mkdir()
    subprocess.run([*command("reference"), "tracking.enabled=false"], cwd=folder, check=True,
                   env=environment(root, "own"), capture_output=True, timeout=600)  # fmt: skip
    state = checkpoint.newest_in(folder / "runs" / "reference").state
    assert state is not None
    return state["model"]


def one_round(root: Path, number: int, fault: str, group: str,
              reference: dict[str, torch.Tensor]) -> dict[str, Any]:  # fmt: skip
    folder = root / f"round{number}"
    folder.mkdir()
    name = f"soak-{number}"
    run_dir = folder / "runs" / name
    if fault == "disk-full":
        asked = {faults.DISK_FULL_AT_CHECKPOINT: 2}
        first = subprocess.run(command(name), cwd=folder, env=environment(root, group, **asked),
                               capture_output=True, timeout=600)  # fmt: skip
        first_code = first.returncode
    else:
        first_code = interrupted(folder, root, name, group, fault, run_dir)
    again = subprocess.run(command(name), cwd=folder, env=environment(root, group),
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    checks = {
        "fault ended the first command": first_code != 0,
        "second command exit 0": again.returncode == 0,
        "final weights bitwise the uninterrupted run's": same_weights(run_dir, reference),
        "one MLflow run, FINISHED, one value per step": (problem := mlflow_problem(folder, name))
        is None,
        "no worker left": no_worker_left(folder, root / "home", group),
        "no secret on disk": not secret_in(folder, root / "home"),
    }
    failed = [check for check, ok in checks.items() if not ok]
    out: dict[str, Any] = {"ok": not failed, "failed": failed, "first_exit": first_code}
    if problem is not None:
        out["mlflow"] = problem
    if failed:
        out["console"] = (again.stdout + again.stderr)[-2000:]
    return out


def interrupted(folder: Path, root: Path, name: str, group: str, fault: str,
                run_dir: Path) -> int:  # fmt: skip
    """Start the command and cause ``fault`` once rank 0 steps in the epoch it needs."""
    epoch = 3 if fault == "corrupt-newest" else 2  # two checkpoints, one to fall back on
    running = subprocess.Popen(
        command(name), cwd=folder, env=environment(root, group), stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    pattern = re.compile(RANK_0_STEP.format(epoch=epoch), re.M)
    log = run_dir / "worker-output.log"
    deadline = time.monotonic() + 300
    while running.poll() is None and time.monotonic() < deadline:
        found = pattern.search(log.read_text(errors="replace")) if log.exists() else None
        if found is not None:
            if fault == "worker-kill":
                os.kill(int(found[1]), signal.SIGKILL)
            elif fault == "ctrl-c":
                running.send_signal(signal.SIGINT)
            else:  # command-kill, corrupt-newest
                running.kill()
            break
        time.sleep(0.05)
    code = running.wait(timeout=180)
    if fault == "corrupt-newest":
        time.sleep(3)  # the workers notice their command is gone and stop
        newest = checkpoint.newest_verified(run_dir)
        assert newest is not None
        state = newest / "state.pt"
        data = bytearray(state.read_bytes())
        data[len(data) // 2] ^= 0xFF
        state.write_bytes(bytes(data))
    return code


def same_weights(run_dir: Path, reference: dict[str, torch.Tensor]) -> bool:
    state = checkpoint.newest_in(run_dir).state
    if state is None:
        return False
    return all(torch.equal(state["model"][key], value) for key, value in reference.items())


def mlflow_problem(folder: Path, name: str) -> str | None:
    """Why the round's MLflow record is not one FINISHED run with one value per step, or None."""
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("trainforge")
    if experiment is None:
        return "no experiment"
    runs = client.search_runs([experiment.experiment_id], f"tags.`trainforge.run_name` = '{name}'")
    if len(runs) != 1 or runs[0].info.status != "FINISHED":
        return f"runs: {[r.info.status for r in runs]}"
    for key in runs[0].data.metrics:
        steps = [m.step for m in client.get_metric_history(runs[0].info.run_id, key)]
        if len(steps) != len(set(steps)):
            return f"{key} repeats steps {sorted({s for s in steps if steps.count(s) > 1})}"
    return None


def no_worker_left(folder: Path, home: Path, group: str) -> bool:
    """No process of this round runs a loop 30 s on: the command's own workers (found by their
    folder) are gone; warm workers (found by this soak's home in their environment) may stay
    warm, but none is in a run (their title names the call they are in)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if not [pid for pid in _pids() if _in_a_run(pid, folder, home, group)]:
            return True
        time.sleep(0.5)
    return False


def _pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _in_a_run(pid: int, folder: Path, home: Path, group: str) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if group == "own":
            ours = Path(f"/proc/{pid}/cwd").resolve() == folder.resolve()
            return b"trainforge.worker.own" in cmdline and ours
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if group == "ray-train":  # Ray Train's workers of the soak's cluster
            token = f"RAY_AUTH_TOKEN={JOINED['RAY_AUTH_TOKEN']}".encode()
            return b"RayTrainWorker" in cmdline and token in environ
        return b"WarmWorker.run" in cmdline and f"TRAINFORGE_HOME={home}".encode() in environ
    except OSError:
        return False


def secret_in(*roots: Path) -> list[str]:
    found = []
    for root in roots:
        for path in root.rglob("*"):
            try:
                if (
                    path.is_file()
                    and not path.is_symlink()
                    and SECRET.encode() in path.read_bytes()
                ):
                    found.append(str(path))
            except OSError:
                continue
    return found


if __name__ == "__main__":
    sys.exit(main())
