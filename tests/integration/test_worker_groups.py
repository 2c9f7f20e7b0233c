"""The contract every worker group keeps (``driver/workers/``), tested the same way on each of
the three: the command's own processes (``TRAINFORGE_WORKERS=own``), the lasting local
cluster's warm workers (``warm``, in a home of its own) and Ray Train's worker group on a
cluster joined by address (``RAY_ADDRESS`` to a `ray start --head` on this machine). Every run
is a real ``trainforge train`` command; faults come from the tests' worker plugin
(``tests/faults.py``) or from outside (a SIGKILL, a Ctrl-C).

- a worker SIGKILLed mid-run with ``run.max_failures=1``: the restart is said once, naming the
  killed rank's process, and counted; then the command itself SIGKILLed, and run again: it
  resumes from the last checkpoint in the same MLflow run, which logs each epoch once and one
  value per step, and ends bitwise where an uninterrupted run ends;
- a worker that raises an error with ``run.max_failures=1``: the restart is said once, naming
  the rank and its error, and counted, and the run ends bitwise as uninterrupted;
- a second command on the same run is refused while the first runs; a Ctrl-C then ends the
  first with one line, exit 130, the MLflow run KILLED and no worker process left;
- a rank that stops responding: the others' collective times out, one line names the rank that
  waited and the setting, exit 1, no worker left;
- a loss gone NaN stops every rank at once, with one line (advice fitted to the recipe, no
  traceback after it), and is not restarted;
- credentials in the tracking URI reach a server that requires basic auth, and they and secrets
  in the environment are in no file and no line;
- a run MLflow never saw, synced later, holds what a run tracked live holds;
- a user's own project (``examples/wave``, a workload of its own; ``examples/oscillator``, an
  SBI simulator with its own embedding net; each copied to a folder outside the repository)
  trains, is restarted after a worker is SIGKILLed (wave: then the command SIGKILLed, and run
  again), and ends bitwise as uninterrupted, its settings in MLflow;
- a resume with a changed recipe is refused, naming the key, before any worker starts; with
  ``checkpoint.allow_changes`` the changed value is the one trained with, and every record
  (step lines, checkpoint, MLflow) says so.

A capability added later gets a test here, and so runs on every path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from mlflow.tracking import MlflowClient

from tests import faults
from tests.conftest import RECIPES
from tests.integration.mlflow_server import MlflowServer, free_port, recorded
from tests.integration.ray_nodes import RayNodes
from trainforge import checkpoint, config, optim

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.xdist_group("worker-groups")]

DIGITS = RECIPES / "cnn" / "digits_simple_cnn.yaml"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
# batch 8: 89 steps an epoch per worker (1437 samples over 2 workers), ~1 s; augmentation on,
# so that a resume must restore every rank's random streams to end bitwise the same
STEPS_PER_EPOCH = 89
# no logged model (~3 CPU-s of each command here) but where a test compares them (the synced
# run with the live one); the model's logging is tests/integration/test_tracking.py's
COMMON = ["scaling.num_workers=2", "train.epochs=3", "train.batch_size=8",
          "workload.augment=true", "tracking.system_metrics=false",
          "tracking.log_model=false"]  # fmt: skip
TIMEOUT_S = 20  # the hang test's scaling.timeout_s
GROUPS = ["own", "warm", "ray-train"]


@dataclass
class Place:
    """Where a group's commands run: their environment, and how to find their workers."""

    kind: str
    folder: Path
    env: dict[str, str]
    marker: bytes = b""
    """In every worker process's environment (a home, a cluster's token): ours, not another
    test's."""
    runs: list[str] = field(default_factory=list)
    ray_logs: Path | None = None
    """The temp dir of the cluster joined by address (its Ray logs)."""

    def command(self, *args: str) -> list[str]:
        return [sys.executable, "-m", "trainforge", *args]

    def train(self, *overrides: str, env: dict[str, str] | None = None,
              timeout: float = 600) -> subprocess.CompletedProcess[str]:  # fmt: skip
        return subprocess.run(
            self.command("train", str(DIGITS), *COMMON, *overrides), cwd=self.folder,
            env=env or self.env, capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip

    def start(self, *overrides: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """A command in the background, stoppable as from a terminal (an xdist worker ignores
        SIGINT, and its children inherit that)."""
        return subprocess.Popen(
            self.command("train", str(DIGITS), *COMMON, *overrides), cwd=self.folder,
            env=env or self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip

    def workers(self) -> list[int]:
        """The pids of this place's worker processes now."""
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                if self.kind == "own":
                    ours = b"trainforge.worker.own" in cmdline and (
                        (entry / "cwd").resolve() == self.folder.resolve()
                    )
                else:
                    name = b"WarmWorker" if self.kind == "warm" else b"RayTrainWorker"
                    ours = name in cmdline and self.marker in (entry / "environ").read_bytes()
                if ours and not _zombie(entry):
                    found.append(int(entry.name))
            except OSError:
                continue
        return found

    def mlflow_run(self, name: str) -> Any:
        client = MlflowClient(f"sqlite:///{self.folder / 'mlflow.db'}")
        experiment = client.get_experiment_by_name("trainforge")
        assert experiment is not None
        runs = client.search_runs([experiment.experiment_id],
                                  f"tags.`trainforge.run_name` = '{name}'")  # fmt: skip
        assert len(runs) == 1, [r.info.run_id for r in runs]  # one MLflow run, however it went
        return runs[0]


def _zombie(entry: Path) -> bool:
    return (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z"


@pytest.fixture(scope="module", params=GROUPS)
def place(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Place]:
    kind: str = request.param
    folder = tmp_path_factory.mktemp(kind)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "TRAINFORGE_", "MLFLOW_TRACKING_URI"))}  # fmt: skip
    env["TRAINFORGE_HOME"] = str(folder / "home")
    if kind == "ray-train":
        nodes = RayNodes(folder).start_head("--num-cpus=2", wait_for_jobs=False)
        env |= {k: v for k, v in nodes.env.items() if k.startswith("RAY_")}
        # the cluster's token, and no RAY_AUTH_MODE: as after `ray start`, whose token file
        # is enough for a command to join (Ray's own driver would not send it)
        del env["RAY_AUTH_MODE"]
        env["RAY_ADDRESS"] = nodes.gcs
        token = f"RAY_AUTH_TOKEN={env['RAY_AUTH_TOKEN']}".encode()
        yield Place(kind, folder, env, marker=token, ray_logs=nodes.temp_dir)
        nodes.stop()
        return
    env["TRAINFORGE_WORKERS"] = kind
    yield Place(kind, folder, env, marker=f"TRAINFORGE_HOME={env['TRAINFORGE_HOME']}".encode())
    if kind == "warm":
        subprocess.run(Place(kind, folder, env).command("cluster", "stop"), env=env, timeout=120)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The final checkpoint of the same recipe run without a fault, on the command's own
    processes (MLflow off: it does not change what is computed)."""
    folder = tmp_path_factory.mktemp("uninterrupted")
    env = {**os.environ, "TRAINFORGE_WORKERS": "own", "TRAINFORGE_HOME": str(folder / "home")}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-m", "trainforge", "train", str(DIGITS), *COMMON,
         "run.name=uninterrupted", "tracking.enabled=false"],
        cwd=folder, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    found = checkpoint.newest_in(folder / "runs" / "uninterrupted")
    assert found.state is not None
    return found.state


RANK_0_STEP = (
    r"^\((?:RayTrainWorker|TrainforgeWorker rank=0) (\d+)\) \[trainforge\] epoch {}/3 step"
)
STEP_OF_EPOCH_2, STEP_OF_EPOCH_3 = (re.compile(RANK_0_STEP.format(n), re.M) for n in (2, 3))


def kill_rank_0_then_the_command(log: Path, command: subprocess.Popen[str], killed: list[int],
                                 the_command_too: bool = True) -> None:  # fmt: skip
    """Once rank 0 says a step of epoch 2 (epoch 1's checkpoint is saved), SIGKILL its process:
    the one that prints, saves and logs; once the restarted rank 0 says a step of epoch 3,
    SIGKILL the command itself (as ``kill -9`` or the OOM killer), if ``the_command_too``."""
    while command.poll() is None:
        said = log.read_text() if log.exists() else ""
        step = (STEP_OF_EPOCH_3 if killed else STEP_OF_EPOCH_2).search(said)
        if step is not None:
            if killed:
                command.kill()
                killed.append(command.pid)
                return
            os.kill(int(step[1]), signal.SIGKILL)
            killed.append(int(step[1]))
            if not the_command_too:
                return
        time.sleep(0.05)


def said_while_killing(command: subprocess.Popen[str], log: Path,
                       the_command_too: bool) -> tuple[str, list[int]]:  # fmt: skip
    """What ``command`` said to its end while ``kill_rank_0_then_the_command`` watched its
    workers' ``log``, and the pids killed."""
    killed: list[int] = []  # rank 0's pid, then the command's, once killed
    killer = threading.Thread(target=kill_rank_0_then_the_command,
                              args=(log, command, killed, the_command_too))  # fmt: skip
    killer.start()
    try:
        said, _ = command.communicate(timeout=600)
    finally:
        command.kill()
        killer.join()
    return said, killed


def test_a_killed_worker_then_a_killed_command_end_as_uninterrupted(
    place: Place, uninterrupted: dict[str, Any]
) -> None:
    """Rank 0 SIGKILLed in epoch 2 with a restart left: the restart is said once, naming the
    killed rank's process, and counted. The command itself SIGKILLed in epoch 3: the same
    command again resumes from epoch 2's checkpoint. The run ends bitwise where an
    uninterrupted one ends, as one MLflow run with one value per step of every metric."""
    log = place.folder / "runs" / "killed" / "worker-output.log"
    # epochs 2 and 3 slowed (0.05 s a step; the same computation): each kill lands in the epoch
    # it aims at, not after that epoch's checkpoint (seen in CI: rank 0's, after epoch 2's)
    slow = faults.env(place.env, **{faults.SLOW_FROM_STEP: STEPS_PER_EPOCH + 1})
    first = place.start("run.name=killed", "run.max_failures=1", env=slow)
    said, killed = said_while_killing(first, log, the_command_too=True)
    assert first.returncode == -signal.SIGKILL and len(killed) == 2, said[-3000:]
    restarts = [line for line in said.splitlines() if "restarting the workers" in line]
    assert len(restarts) == 1, said[-3000:]
    assert "(rank 0) " in restarts[0] and str(killed[0]) in restarts[0], restarts
    assert "workers restarted (1 so far, run.max_failures), resuming" in said
    workers_ended(place)
    again = place.train("run.name=killed", "run.max_failures=1", "checkpoint.resume=true")
    said = again.stdout + again.stderr
    assert again.returncode == 0, said[-3000:]
    assert "resuming at epoch 3 step 178" in said, said[-3000:]  # epoch 2's checkpoint
    final, run, client = _ended_as_uninterrupted_after_one_restart(place, "killed", uninterrupted)
    assert final["epoch"] == 3
    epochs = client.get_metric_history(run.info.run_id, "epoch")
    assert [int(m.value) for m in epochs] == [1, 2, 3]  # each epoch once: none repeated
    for key in run.data.metrics:  # and one value per step of every metric
        steps = [m.step for m in client.get_metric_history(run.info.run_id, key)]
        assert len(steps) == len(set(steps)), (key, sorted(steps))


def workers_ended(place: Place) -> None:
    """Wait up to a minute for a SIGKILLed command's workers to end with it (warm workers stay:
    each stops its loop itself, and the next command waits for that)."""
    deadline = time.monotonic() + 60
    while place.workers() and place.kind != "warm" and time.monotonic() < deadline:
        time.sleep(0.2)


def test_a_worker_that_raises_is_restarted_and_the_run_ends_as_uninterrupted(
    place: Place, uninterrupted: dict[str, Any]
) -> None:
    """Rank 1 raises an ordinary error in epoch 2 with a restart left, while rank 0 waits for
    it in the step's all-reduce: the restart is said once, naming the rank and its error, the
    workers resume from epoch 1's checkpoint (past the error: it happens once), and the run
    ends bitwise where an uninterrupted one ends, as one MLflow run that counts the restart."""
    at = STEPS_PER_EPOCH + 11
    ran = place.train("run.name=raised", "run.max_failures=1",
                      env=faults.env(place.env, **{faults.RAISE_AT_STEP: at}))  # fmt: skip
    said = ran.stdout + ran.stderr
    assert ran.returncode == 0, said[-3000:]
    restarts = [line for line in said.splitlines() if "restarting the workers" in line]
    assert restarts == [
        f"[trainforge] rank 1 failed (RuntimeError: injected error at step {at} "
        f"({faults.RAISE_AT_STEP})); restarting the workers"
    ], said[-3000:]
    assert "workers restarted (1 so far, run.max_failures), resuming" in said
    _ended_as_uninterrupted_after_one_restart(place, "raised", uninterrupted)


def _ended_as_uninterrupted_after_one_restart(
    place: Place, name: str, uninterrupted: dict[str, Any]
) -> tuple[dict[str, Any], Any, MlflowClient]:
    """The run ``name`` ended at the uninterrupted run's last step with its weights bitwise, as
    one FINISHED MLflow run that counts one restart, at the end of epoch 1; its final state, its
    MLflow run and a client of the place's store."""
    final = checkpoint.newest_in(place.folder / "runs" / name).state
    assert final is not None and final["global_step"] == 3 * STEPS_PER_EPOCH
    for key, weights in uninterrupted["model"].items():
        assert torch.equal(final["model"][key], weights), key
    run = place.mlflow_run(name)
    assert run.info.status == "FINISHED"
    client = MlflowClient(f"sqlite:///{place.folder / 'mlflow.db'}")
    restarted = client.get_metric_history(run.info.run_id, "run/restarts")
    assert [(m.value, m.step) for m in restarted] == [(1.0, STEPS_PER_EPOCH)]
    return final, run, client


@dataclass(frozen=True, eq=False)
class Example:
    """A project under examples/, trained as a user would from a copy of its folder."""

    name: str
    files: tuple[str, ...]
    run_name: str
    overrides: tuple[str, ...]
    """Fewer steps than the example's own recipe (3 epochs, a step line every 2 steps)."""
    steps_per_epoch: int
    params: dict[str, str]
    """Some of the settings MLflow must hold: the user's code by import path."""
    metric: str
    """A metric the example's evaluation logs."""
    kill_the_command: bool = False
    """After rank 0, the command itself is SIGKILLed in epoch 3, and run again."""

    def project(self, parent: Path) -> Path:
        """The example's files in a folder of their own outside the repository, so only that
        folder makes its modules importable."""
        project = parent / f"{self.name}-project"
        project.mkdir()
        for name in self.files:
            shutil.copy(EXAMPLES / self.name / name, project / name)
        return project

    def command(self, *overrides: str) -> list[str]:
        return [sys.executable, "-m", "trainforge", "train", "recipe.yaml", *self.overrides,
                *overrides]  # fmt: skip


WAVE = Example(
    "wave", ("wave_task.py", "recipe.yaml"), "wave-regression",
    ("train.epochs=3", "tracking.system_metrics=false", "train.log_every_steps=2",
     "tracking.log_model=false"),
    steps_per_epoch=32,  # 4096 rows in batches of 64 over 2 workers
    params={"workload.entry": "wave_task:WaveRegression", "workload.config.hidden": "64"},
    metric="val/rmse",
    kill_the_command=True,
)  # fmt: skip
OSCILLATOR = Example(
    "oscillator", ("oscillator.py", "recipe.yaml"), "oscillator",
    ("train.epochs=3", "train.log_every_steps=2", "workload.simulation.num_simulations=4000",
     "workload.simulation.chunk_size=2000", "workload.evaluation.sbc_runs=20",
     "tracking.log_model=false"),
    steps_per_epoch=14,  # 3600 training rows in batches of 128 over 2 workers
    params={"workload.simulator": "oscillator:simulate",
            "workload.estimator.embedding": "oscillator:Features"},
    metric="sbc/ks_pvalue_min",
)  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted_example(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[Example], dict[str, Any]]:
    """An example's final checkpoint without a fault, on the command's own processes, made at
    its first use. Not a parametrised fixture: a second one of module scope beside ``place``
    would reorder the module's tests, and some follow the run another left (``killed``)."""
    made: dict[str, dict[str, Any]] = {}

    def final_state(chosen: Example) -> dict[str, Any]:
        if chosen.name not in made:
            project = chosen.project(tmp_path_factory.mktemp(f"{chosen.name}-uninterrupted"))
            env = {**os.environ, "TRAINFORGE_WORKERS": "own",
                   "TRAINFORGE_HOME": str(project / "home")}  # fmt: skip
            env.pop("RAY_ADDRESS", None)
            done = subprocess.run(chosen.command("tracking.enabled=false"), cwd=project, env=env,
                                  capture_output=True, text=True, timeout=600)  # fmt: skip
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
            found = checkpoint.newest_in(project / "runs" / chosen.run_name)
            assert found.state is not None
            made[chosen.name] = found.state
        return made[chosen.name]

    return final_state


@pytest.mark.parametrize("chosen", [WAVE, OSCILLATOR], ids=lambda e: e.name)
def test_a_users_own_project_resumes_bitwise_after_a_worker_is_killed(
    place: Place, chosen: Example, uninterrupted_example: Callable[[Example], dict[str, Any]]
) -> None:
    """An example project of a user's (its modules importable only from its folder): rank 0
    SIGKILLed in epoch 2 with a restart left; the run resumes from epoch 1's checkpoint (wave:
    the command SIGKILLed in epoch 3, and the same command again resumes from epoch 2's) and
    ends bitwise where an uninterrupted run ends, as one FINISHED MLflow run holding the
    project's own settings and evaluation, each epoch logged once."""
    uninterrupted = uninterrupted_example(chosen)
    project = chosen.project(place.folder)
    log = project / "runs" / chosen.run_name / "worker-output.log"
    # epochs 2 and 3 slowed (the same computation): each kill lands in the epoch it aims at,
    # not after that epoch's checkpoint (an example's epoch ends within a second)
    env = faults.env(place.env, **{faults.SLOW_FROM_STEP: chosen.steps_per_epoch + 1})
    command = subprocess.Popen(
        chosen.command("run.max_failures=1"), cwd=project, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    said, killed = said_while_killing(command, log, the_command_too=chosen.kill_the_command)
    assert "workers restarted (1 so far, run.max_failures), resuming" in said, said[-3000:]
    if chosen.kill_the_command:
        assert command.returncode == -signal.SIGKILL and len(killed) == 2, said[-3000:]
        workers_ended(replace(place, folder=project))
        again = subprocess.run(chosen.command("run.max_failures=1"), cwd=project, env=place.env,
                               capture_output=True, text=True, timeout=600)  # fmt: skip
        said = again.stdout + again.stderr
        assert again.returncode == 0, said[-3000:]
        assert f"resuming at epoch 3 step {2 * chosen.steps_per_epoch}" in said, said[-3000:]
    else:
        assert command.returncode == 0 and len(killed) == 1, said[-3000:]
    final = checkpoint.newest_in(project / "runs" / chosen.run_name).state
    assert final is not None and final["global_step"] == 3 * chosen.steps_per_epoch
    for key, weights in uninterrupted["model"].items():
        assert torch.equal(final["model"][key], weights), key
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("trainforge").experiment_id])
    assert run.info.status == "FINISHED"
    assert chosen.params.items() <= run.data.params.items(), run.data.params
    assert chosen.metric in run.data.metrics, sorted(run.data.metrics)
    restarted = client.get_metric_history(run.info.run_id, "run/restarts")
    assert [(m.value, m.step) for m in restarted] == [(1.0, chosen.steps_per_epoch)]
    epochs = client.get_metric_history(run.info.run_id, "epoch")
    assert [int(m.value) for m in epochs] == [1, 2, 3]


def test_a_second_command_is_refused_and_a_ctrl_c_ends_the_run_leaving_no_worker(
    place: Place,
) -> None:
    running = place.start("run.name=stopped", "train.epochs=50")
    try:
        assert running.stdout is not None
        seen: list[str] = []
        for line in running.stdout:  # once the loop has begun
            seen.append(line)
            if re.match(r"\[trainforge\] epoch 1/50 step", line):
                break
        workers = place.workers()
        assert len(workers) == 2, "".join(seen)
        second = place.train("run.name=stopped", "train.epochs=50", timeout=120)
        assert second.returncode == 2, second.stdout + second.stderr
        (refusal,) = second.stderr.splitlines()
        assert refusal.startswith(
            "trainforge: error: run.name: run 'stopped' is in use by "
            f"another trainforge command (pid {running.pid} "
        ), refusal
        running.send_signal(signal.SIGINT)
        rest, _ = running.communicate(timeout=120)
    finally:
        running.kill()
    lines = [line for line in rest.splitlines() if line.strip()]
    assert running.returncode == 130, "".join(seen) + rest
    assert lines[-1].startswith("[trainforge] interrupted;"), lines
    assert "Traceback" not in rest and "KeyboardInterrupt" not in rest, rest
    deadline = time.monotonic() + 30
    while set(workers) & set(place.workers()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not set(workers) & set(place.workers()), "a worker outlived the run"
    assert place.mlflow_run("stopped").info.status == "KILLED"


def test_a_rank_that_stops_responding_ends_the_run_in_one_line_naming_who_waited(
    place: Place,
) -> None:
    """Rank 1 stops before a step of epoch 2; rank 0 waits for it in the step's all-reduce
    until the process group's timeout."""
    ran = place.train(
        "run.name=hung",
        f"scaling.timeout_s={TIMEOUT_S}",
        env=faults.env(place.env, **{faults.HANG_AT_STEP: STEPS_PER_EPOCH + 11}),
    )
    failed = [line for line in ran.stderr.splitlines() if line.startswith("[trainforge] training")]
    assert ran.returncode == 1, ran.stdout[-3000:] + ran.stderr[-3000:]
    assert failed == [
        f"[trainforge] training failed: rank 0 waited scaling.timeout_s={TIMEOUT_S} s in a "
        "collective for a worker that stopped responding (a deadlock, a stuck data loader, "
        "device or storage); all workers were stopped. If a worker is only slow at times (a "
        "long evaluation or checkpoint on one rank), raise scaling.timeout_s; the same command "
        "resumes from the last checkpoint"
    ], ran.stderr[-3000:]
    assert "Traceback" not in ran.stdout + ran.stderr
    assert place.workers() == [] or (place.kind == "warm" and _hung_gone(place))
    run = place.mlflow_run("hung")
    assert run.info.status == "FAILED" and run.data.tags["trainforge.failure"] in failed[0]


def _hung_gone(place: Place) -> bool:
    """Warm workers outlive runs, but not a failed one's: those were stopped (a worker blocked
    in a collective is not reusable); none runs a loop."""
    deadline = time.monotonic() + 30
    while place.workers() and time.monotonic() < deadline:
        time.sleep(0.2)
    return place.workers() == []


def test_a_loss_gone_nan_stops_every_rank_in_one_line_without_a_restart(place: Place) -> None:
    ran = place.train("run.name=nan", "train.lr=1e5", "checkpoint.every_steps=5",
                      "train.log_every_steps=10", "run.max_failures=1")  # fmt: skip
    said = ran.stdout + ran.stderr
    assert ran.returncode == 1, said[-3000:]
    stopped = [line for line in ran.stderr.splitlines() if line.startswith("[trainforge] training")]
    assert len(stopped) == 1, said[-3000:]
    assert re.fullmatch(
        r"\[trainforge\] training stopped: (train/loss became (nan|inf)|the weights became "
        r"non-finite) by step \d+ \(rank 0, 1\).*; the run stops here and keeps its "
        r"checkpoints from before\. Try a lower train\.lr or train\.clip_grad_norm \(e\.g\. 1\.0\)",
        stopped[0],
    ), stopped  # the recipe is in fp32 already: the advice does not suggest it
    assert "restarting the workers" not in said  # restarting would only repeat it
    # nothing after the line: no traceback of a worker's failed call left unread
    assert "Traceback" not in said and "Unhandled error" not in said, said[-3000:]
    run = place.mlflow_run("nan")
    assert run.info.status == "FAILED" and run.data.tags["trainforge.failure"] in stopped[0]
    for folder in (place.folder / "runs" / "nan").glob("checkpoint_*"):
        if not folder.is_dir():  # beside them: Ray Train's own record of its checkpoints
            continue
        state = checkpoint.load(folder)
        assert all(torch.isfinite(weights).all() for weights in state["model"].values())


def test_a_resume_with_a_changed_recipe_is_refused_naming_the_key(place: Place) -> None:
    """After the killed run of this place (its checkpoints are there)."""
    ran = place.train("run.name=killed", "checkpoint.resume=true", "train.lr=0.01",
                      "train.epochs=4", timeout=300)  # fmt: skip
    assert ran.returncode == 2, ran.stdout[-3000:] + ran.stderr[-3000:]
    (refusal,) = ran.stderr.splitlines()
    assert refusal.startswith(
        "trainforge: error: run.name: run 'killed' was trained with "
        "another recipe (train.lr 0.002 -> 0.01)"
    ), refusal
    assert "Traceback" not in ran.stdout and "workers: starting" not in ran.stdout  # none started
    deadline = time.monotonic() + 30
    while place.workers() and place.kind != "warm" and time.monotonic() < deadline:
        time.sleep(0.2)
    assert place.kind == "warm" or place.workers() == []  # warm workers stay warm, idle


STEP_LINE = re.compile(r"\[trainforge\] epoch 4/4 step (\d+)/\d+ loss \S+ lr (\S+)")


def test_a_change_allowed_on_resume_is_the_one_trained_with_and_recorded(place: Place) -> None:
    """``checkpoint.allow_changes``: the changed LR is the loop's from the resume on (its step
    lines and the optimizer in the new checkpoint), the new checkpoint's recipe says it, and
    the MLflow run (whose params keep their first values) records the change as a tag."""
    ran = place.train("run.name=killed", "train.lr=0.01", "train.epochs=4",
                      "checkpoint.allow_changes=true", timeout=300)  # fmt: skip
    said = ran.stdout + ran.stderr
    assert ran.returncode == 0, said[-3000:]
    assert "resuming run 'killed' with a changed recipe: train.lr 0.002 -> 0.01" in said
    total = 4 * STEPS_PER_EPOCH
    train = config.load(DIGITS, [*COMMON, "train.epochs=4", "train.lr=0.01"]).train
    steps = [(int(step), float(lr)) for step, lr in STEP_LINE.findall(ran.stdout)]
    assert steps, said[-3000:]
    for step, lr in steps:  # the lr after the step's update, printed to 3 digits
        assert lr == pytest.approx(0.01 * optim.lr_factor(step, total, train), rel=0.01), step
    latest = checkpoint.newest_verified(place.folder / "runs" / "killed")
    assert latest is not None
    state = checkpoint.load(latest)
    assert state["global_step"] == total
    (group,) = state["optimizer"]["param_groups"]
    assert group["initial_lr"] == 0.01 and state["scheduler"]["base_lrs"] == [0.01]
    assert config.load(latest / checkpoint.RECIPE_FILE).train.lr == 0.01
    run = place.mlflow_run("killed")
    assert run.data.params["train.lr"] == "0.002"  # MLflow keeps a param's first value
    assert run.data.tags["trainforge.changed.train.lr"] == "0.002 -> 0.01"


USER, PASSWORD = "alice", "uri-pw-7f3a1c"
"""The tracking server's user: it requires basic auth."""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    root = tmp_path_factory.mktemp("mlflow-server")
    server = MlflowServer(root, credentials=(USER, PASSWORD)).start()
    yield server
    server.stop()


def refuses_the_anonymous(server: MlflowServer) -> bool:
    """Whether the server answers a request without credentials with 401."""
    url = f"{server.url}/api/2.0/mlflow/experiments/search?max_results=1"
    try:
        urllib.request.urlopen(url, timeout=10).close()
    except urllib.error.HTTPError as refused:
        return refused.code == 401
    return False


def test_credentials_and_planted_secrets_are_in_nothing_the_run_wrote_or_said(
    place: Place, server: MlflowServer
) -> None:
    """Credentials in the tracking URI, typed on the command line, reach a server that requires
    basic auth: the run is made and its metrics arrive, read back as that user (the password
    planted in MLFLOW_TRACKING_PASSWORD is not the user's: the URI's are the ones sent). They,
    and secrets in the environment (one that trainforge forwards to its workers, one it does
    not), appear nowhere: not on the console, in the run folder (checkpoints, recipe, worker
    output, spool), the home (the lasting cluster's files), the Ray logs of the cluster the
    workers ran on, or the MLflow store (params, tags, artifacts, the databases of runs and
    users)."""
    aws_key, mlflow_password = "aws-planted-9c1e4b", "mlf-planted-5b2d8e"
    assert refuses_the_anonymous(server)
    host = server.url.removeprefix("http://")
    env = place.env | {"AWS_SECRET_ACCESS_KEY": aws_key, "MLFLOW_TRACKING_USERNAME": USER,
                       "MLFLOW_TRACKING_PASSWORD": mlflow_password}  # fmt: skip
    name = f"secretive-{place.kind}"
    ran = place.train(f"run.name={name}", "train.epochs=1",
                      f"tracking.tracking_uri=http://{USER}:{PASSWORD}@{host}",
                      "tracking.system_metrics=true", "tracking.system_metrics_interval_s=0.5",
                      "tracking.log_model=true", env=env)  # fmt: skip
    console = ran.stdout + ran.stderr
    assert ran.returncode == 0, console[-3000:]
    assert f"{USER}:***@" not in console and "***@" + host in console  # the URI, redacted, shown
    client = MlflowClient(tracking_uri=server.authenticated_url)
    (run,) = client.search_runs([client.get_experiment_by_name("trainforge").experiment_id],
                                f"tags.`trainforge.run_name` = '{name}'")  # fmt: skip
    assert run.info.status == "FINISHED"
    epochs = client.get_metric_history(run.info.run_id, "epoch")
    assert [(m.value, m.step) for m in epochs] == [(1.0, STEPS_PER_EPOCH)]
    assert client.get_metric_history(run.info.run_id, "train/loss")
    recorded = {**run.data.params, **run.data.tags}
    assert recorded["tracking.tracking_uri"] == f"http://***@{host}"
    roots = [place.folder, server.root, *_ray_folders(place)]
    written = [p for root in roots for p in root.rglob("*") if p.is_file() and not p.is_symlink()]
    assert any(p.name == "state.pt" for p in written) and any(p.suffix == ".db" for p in written)
    for secret in (PASSWORD, aws_key, mlflow_password):
        assert secret not in console
        assert not [k for k, v in recorded.items() if secret in v], secret
        assert not [p for p in written if secret.encode() in _bytes(p)], secret


def test_a_run_mlflow_never_saw_is_synced_whole(place: Place, server: MlflowServer) -> None:
    """MLflow unreachable for the whole run: it is kept in the spool, and `trainforge
    tracking-sync` sends all of it (to the server that requires basic auth, the user's
    credentials in MLFLOW_TRACKING_USERNAME/PASSWORD). The synced run then holds what the same
    recipe tracked live holds (the secrets test's run, before this one), key by key: params,
    every metric's steps, tags, artifacts (its learning curve), the logged model, the dataset
    input."""
    name = f"offline-{place.kind}"
    ran = place.train(
        f"run.name={name}",
        "train.epochs=1",
        f"tracking.tracking_uri=http://127.0.0.1:{free_port()}",
        "tracking.system_metrics=true",
        "tracking.system_metrics_interval_s=0.5",
        "tracking.log_model=true",
    )
    said = ran.stdout + ran.stderr
    assert ran.returncode == 0, said[-3000:]
    assert re.search(r"MLflow at \S+ is unreachable .*tracking-sync", said), said[-3000:]
    synced = subprocess.run(
        place.command("tracking-sync", str(place.folder / "runs" / name), "--tracking-uri",
                      server.url),
        cwd=place.folder, capture_output=True, text=True, timeout=300,
        env=place.env | {"MLFLOW_TRACKING_USERNAME": USER, "MLFLOW_TRACKING_PASSWORD": PASSWORD},
    )  # fmt: skip
    assert synced.returncode == 0, synced.stdout + synced.stderr
    client = MlflowClient(tracking_uri=server.authenticated_url)
    experiment = client.get_experiment_by_name("trainforge").experiment_id
    (offline,) = client.search_runs([experiment], f"tags.`trainforge.run_name` = '{name}'")
    (live,) = client.search_runs(
        [experiment], f"tags.`trainforge.run_name` = 'secretive-{place.kind}'"
    )
    kept, tracked = recorded(client, offline), recorded(client, live)
    for what in tracked:
        assert kept[what] == tracked[what], what


def test_a_wrong_password_is_one_line_and_the_run_is_kept_for_tracking_sync(
    server: MlflowServer, tmp_path: Path
) -> None:
    """The server refuses the credentials in the tracking URI: training goes on, one line says
    that the server refused them (not that it is unreachable), what to check and where the run
    is kept, with no password and no traceback; the run's records wait in the spool. On the
    command's own processes only: every worker group's run is made by the same
    ``tracking.start_run`` (the warm tracker's too), and the secrets test shows the right
    credentials reaching the server on each."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RAY_", "TRAINFORGE_", "MLFLOW_TRACKING_"))}  # fmt: skip
    env |= {"TRAINFORGE_WORKERS": "own", "TRAINFORGE_HOME": str(tmp_path / "home")}
    wrong, host = "wrong-pw-3e9d", server.url.removeprefix("http://")
    ran = Place("own", tmp_path, env).train(
        "run.name=refused", "train.epochs=1", f"tracking.tracking_uri=http://{USER}:{wrong}@{host}"
    )
    said = ran.stdout + ran.stderr
    assert ran.returncode == 0, said[-3000:]
    folder = tmp_path / "runs" / "refused"
    spool = folder / "tracking-spool.jsonl"
    assert [line for line in said.splitlines() if "MLflow at" in line] == [
        f"[trainforge] warning: MLflow at http://***@{host} refused the credentials (401, not "
        "authenticated): check the user and password in tracking.tracking_uri "
        "(http://user:password@host) or in MLFLOW_TRACKING_USERNAME and "
        f"MLFLOW_TRACKING_PASSWORD; training goes on and the run is kept in {spool} — replay "
        f"it with `trainforge tracking-sync {folder}`"
    ], said[-3000:]
    assert wrong not in said and "Traceback" not in said
    kept = [json.loads(line)["kind"] for line in spool.read_text().splitlines()]
    assert {"params", "metrics", "status"} <= set(kept), kept


def _ray_folders(place: Place) -> list[Path]:
    """Where the Ray that ran this place's workers keeps its logs: the lasting cluster's temp
    dir, or the joined cluster's."""
    if place.kind == "warm":
        state = json.loads((place.folder / "home" / "local-cluster" / "state.json").read_text())
        return [Path(state["temp_dir"])]
    return [place.ray_logs] if place.ray_logs is not None else []


def _bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:  # a socket or a file Ray removed meanwhile
        return b""
