"""What a command that runs other runs shares (an SBI ensemble's members, a sweep's trials):
each is the `trainforge train` a user would start by hand, in a process of its own, on this
command's Ray cluster, its MLflow run nested under this command's."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from trainforge import config, log, settings, storage
from trainforge.atomic import replacing
from trainforge.config import Recipe
from trainforge.config.resolve import worker_resources
from trainforge.driver.cluster import storage_root
from trainforge.driver.local_cluster import on_lasting_cluster
from trainforge.errors import RecipeError
from trainforge.tracking.client import redact_all

RECIPE_FILE = "recipe.yaml"  # the recipe the runs are trained with
# a run's closing table (driver/console.py's summary): "[trainforge]   val/loss   -2.13"
SUMMARY_LINE = re.compile(r"^\[trainforge\] {3}(val/loss|c2st/mean)\s+(\S+)\s*$")
STOP_WAIT_S = 60.0  # how long stopped runs may take to write their last lines


@contextlib.contextmanager
def local_run_held(cfg: Recipe, key: str, why: str) -> Iterator[str]:
    """The run's storage root, its lock held for the command (a second command refuses). Its
    runs meet through files (``why``, said under ``key``): it must be a local or shared
    folder."""
    from trainforge.driver.run_lock import run_held

    root = storage_root(cfg.run)
    if storage.local_folder(root) is None:
        raise RecipeError(
            f"{key}: {why}; run.storage_path {root!r} is not a local or shared folder"
        )
    with run_held(root, cfg.run.name):
        yield root


def earlier_scores(record: Path, field: str) -> dict[str, dict[str, str]]:
    """Run name → what an earlier command's ``record`` (a JSON file) said each run of its
    ``field`` (a list) scored when it finished; empty where there is no record."""
    if not record.is_file():
        return {}
    keys = {"name", "seed", "folder"}
    runs = json.loads(record.read_text()).get(field, [])
    return {r["name"]: {k: v for k, v in r.items() if k not in keys} for r in runs}


def runs_at_once(cfg: Recipe, cluster: dict[str, float], count: int) -> int:
    """How many of ``count`` runs of ``cfg`` the cluster holds at once: each needs its
    workers' resources."""
    run = config.resolve_workers(cfg, cluster).scaling
    use_gpu = run.use_gpu == "true"
    need = {k: v * run.num_workers for k, v in worker_resources(run, use_gpu).items()}
    fits = [int(cluster.get(k, 0) // v) for k, v in need.items() if v > 0]
    return max(1, min([count, *fits]))


def child_env(parent_run_id: str | None, ray: Any) -> dict[str, str]:
    """The runs' environment: this command's, the MLflow parent run, and this command's Ray
    cluster (a private one or RAY_ADDRESS's: they join it rather than starting their own; the
    lasting local cluster they join by themselves, with its warm workers)."""
    env = dict(os.environ)
    if parent_run_id:
        env[settings.PARENT_RUN.name] = parent_run_id
    if not on_lasting_cluster() and "RAY_ADDRESS" not in env:
        env["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    env.setdefault("PYTHONUNBUFFERED", "1")  # their lines as they come
    return env


def loudness() -> list[str]:
    """This command's -q / -v, for the runs' commands."""
    return {-1: ["-q"], 0: [], 1: ["-v"]}[max(-1, min(1, log.verbosity()))]


def check_before_start(cfg: Recipe, root: str, run_dir: Path, free: tuple[str, ...]) -> None:
    """What `train` checks before anything starts or is written (the recipe's data and user
    code, an earlier run of the name), then ``check_recipe``."""
    from trainforge.driver import launch
    from trainforge.workloads import check_workload_data

    check_workload_data(cfg.workload)
    launch.check_existing_run(cfg, root)
    check_recipe(cfg, run_dir, free)


def check_recipe(cfg: Recipe, run_dir: Path, free: tuple[str, ...]) -> None:
    """A re-run keeps the runs that finished, so it must be the recipe they were trained with
    (``recipe_change``'s rules; the keys in ``free`` may change too). The recipe is saved when
    the command first starts."""
    from omegaconf import OmegaConf

    from trainforge.driver import recipe_change

    saved_file = run_dir / RECIPE_FILE
    if saved_file.is_file():
        saved: dict[str, Any] = OmegaConf.to_container(OmegaConf.load(saved_file))  # type: ignore[assignment]
        recipe_change.compare(cfg, saved, free=free)
        if not cfg.checkpoint.allow_changes:
            return
    run_dir.mkdir(parents=True, exist_ok=True)
    with replacing(saved_file) as temporary:
        temporary.write_text(redact_all(config.to_yaml(cfg)))


@dataclass
class ChildRun:
    """One of the runs a command runs (an ensemble's member, a sequential round): its
    ``trainforge train`` process, and what its closing table said."""

    index: int
    seed: int
    name: str
    folder: Path
    prefix: str = "m"
    """Its label's letter on the console: m0, m1 … (members), r0, r1 … (rounds)."""
    process: subprocess.Popen[str] | None = None
    exit_code: int | None = None
    kept: bool = False
    """Finished in an earlier command (it has its posterior): not run again."""
    metrics: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.prefix}{self.index}"


def run_children(
    members: list[ChildRun], command: list[str], env: dict[str, str], at_once: int, what: str
) -> None:
    """Start the runs ``at_once`` at a time (``command`` with each one's run.name and run.seed),
    relay their lines, wait for all. After a failure no other one starts (the running ones
    finish: their work is kept). ``what`` begins their start lines (ensemble, sequential)."""
    pending = deque(members)
    running: list[ChildRun] = []
    relays: list[threading.Thread] = []
    try:
        while pending or running:
            while pending and len(running) < at_once:
                member = pending.popleft()
                member.process = subprocess.Popen(
                    [*command, f"run.name={member.name}", f"run.seed={member.seed}"],
                    env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                    bufsize=1,
                )  # fmt: skip
                log.say(f"{what}: {member.label} started (run.seed {member.seed})")
                relays += [
                    relay_lines(member.process.stdout, sys.stdout, member),
                    relay_lines(member.process.stderr, sys.stderr, member),
                ]
                running.append(member)
            time.sleep(0.2)
            for member in list(running):
                assert member.process is not None
                member.exit_code = member.process.poll()
                if member.exit_code is None:
                    continue
                running.remove(member)
                if member.exit_code != 0:
                    pending.clear()
    except KeyboardInterrupt:  # Ctrl-C (the members got it too) or SIGTERM (they did not)
        stop_children(running)
        raise
    finally:
        for relay in relays:
            relay.join(timeout=5)


def stop_children(running: list[ChildRun]) -> None:
    """Members end the way a stopped run does (one line, resumable): given a moment for the
    Ctrl-C they received with this command, then SIGTERM, then killed."""
    deadline = time.monotonic() + 2
    for member in running:
        assert member.process is not None
        try:
            member.process.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            member.process.send_signal(signal.SIGTERM)
    for member in running:
        assert member.process is not None
        try:
            member.process.wait(timeout=STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            member.process.kill()


_output_lock = threading.Lock()


def relay_lines(stream: IO[str] | None, to: IO[str], member: ChildRun) -> threading.Thread:
    """Copy a member's lines to this command's console, each marked with the member."""

    def copy() -> None:
        assert stream is not None
        for line in stream:
            line = line.rstrip("\n")
            found = SUMMARY_LINE.match(line)
            if found:
                member.metrics[found.group(1)] = found.group(2)
            if line.startswith(log.PREFIX + " "):
                line = f"{log.PREFIX} {member.label}: {line[len(log.PREFIX) + 1 :]}"
            else:
                line = f"{log.PREFIX} {member.label}| {line}"
            with _output_lock:
                to.write(line + "\n")
                to.flush()

    thread = threading.Thread(target=copy, daemon=True, name=f"relay-{member.label}")
    thread.start()
    return thread
