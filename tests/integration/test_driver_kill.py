"""The `trainforge train` command itself SIGKILLed mid-run (`kill -9`, the OOM killer), then the
same command again, on the SBI debug recipe made small (2,000 simulations, a checkpoint every
epoch, no early stopping, no evaluation):

- the killed command's private Ray ends with it: none of its processes is left a few seconds
  later (Ray's own agents would stay a minute: ``driver/reaper.py``);
- its run lock, which it could not remove, is taken over by the second command;
- the second command (on worker processes of its own, as with no cluster kept by default)
  resumes from the latest checkpoint and says so, reuses the simulations
  (not one simulated again), keeps the one MLflow run, which ends FINISHED, and ends at the
  step an uninterrupted run ends at.

The command runs as a child process with a private Ray (not this test session's), as a user
runs it, so that killing its driver is a real `kill -9` of a real driver.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from mlflow.tracking import MlflowClient

from tests.conftest import RECIPES
from trainforge import checkpoint

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SBI = RECIPES / "sbi" / "two_moons_debug.yaml"
NAME, SIMULATIONS, EPOCHS, BATCH, WORKERS = "killed-driver", 2000, 40, 64, 2
# 10% of the simulations are held out for validation; each worker takes half of the rest in
# whole batches (the last partial batch is dropped): 1800 // 2 // 64 = 14 steps an epoch
STEPS_PER_EPOCH = (SIMULATIONS - SIMULATIONS // 10) // WORKERS // BATCH
FINAL_STEP = EPOCHS * STEPS_PER_EPOCH
COMMAND = [
    sys.executable, "-m", "trainforge", "train", str(SBI), f"run.name={NAME}",
    f"workload.simulation.num_simulations={SIMULATIONS}", "workload.simulation.chunk_size=1000",
    f"scaling.num_workers={WORKERS}", f"train.batch_size={BATCH}", f"train.epochs={EPOCHS}",
    "train.early_stopping_patience=0", "checkpoint.every_epochs=1",
    "workload.evaluation.observations=[]", "workload.evaluation.sbc_runs=0",
]  # fmt: skip


def command_env(private_ray: bool) -> dict[str, str]:
    """No cluster kept, MLflow in the working directory, and either a private Ray and Ray
    Train's workers for the command (not the lasting cluster, not this session's Ray) or, as
    by default with no cluster kept, worker processes of the command's own."""
    env = {**os.environ, "TRAINFORGE_WORKERS": "private" if private_ray else "own"}
    for name in ("RAY_ADDRESS", "MLFLOW_TRACKING_URI"):
        env.pop(name, None)
    return env


def left_running(processes: list[psutil.Process], within_s: float) -> list[str]:
    """Those of ``processes`` still running (zombies count as ended) after up to ``within_s``."""
    deadline = time.monotonic() + within_s
    while True:
        alive = []
        for process in processes:
            try:
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(f"{process.pid} {process.name()}")
            except psutil.NoSuchProcess:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def newest_step(run_dir: Path) -> int:
    folder = checkpoint.newest_verified(run_dir)
    assert folder is not None, sorted(p.name for p in run_dir.iterdir())
    return int(checkpoint.verify(folder)["global_step"])


def test_a_killed_driver_leaves_nothing_running_and_the_same_command_resumes(
    tmp_path: Path,
) -> None:
    run_dir, simulations = tmp_path / "runs" / NAME, tmp_path / "runs" / "simulations"
    driver = subprocess.Popen(
        COMMAND, cwd=tmp_path, env=command_env(private_ray=True), stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert driver.stdout is not None
    seen = []
    try:
        for line in driver.stdout:  # epoch 2 done: its checkpoint follows, then epoch 3 trains
            seen.append(line)
            if line.startswith(f"[trainforge] epoch 2/{EPOCHS} done"):
                break
        deadline = time.monotonic() + 30
        while checkpoint.newest_verified(run_dir) is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert driver.poll() is None, "".join(seen)  # still training: killed mid-run
        command = psutil.Process(driver.pid).children(recursive=True)  # Ray, workers, watcher
        names = [_name(p) for p in command]  # now: a short-lived helper may be gone later
        os.kill(driver.pid, signal.SIGKILL)
    finally:
        driver.kill()
        driver.wait(timeout=30)
        driver.stdout.close()
    assert driver.returncode == -signal.SIGKILL, "".join(seen)
    assert any("RayTrainWorker" in name for name in names), names

    # The private Ray ended with its driver: GCS and raylet at once, workers within seconds,
    # the agents (a minute on their own) ended by the watcher.
    assert left_running(command, within_s=10) == []

    killed_at = newest_step(run_dir)  # the workers may have saved more before they ended
    assert 0 < killed_at < FINAL_STEP
    lock = tmp_path / "runs" / f".{NAME}.lock"
    assert json.loads(lock.read_text())["pid"] == driver.pid  # the dead driver's, left behind
    chunks = {c.name: c.stat().st_mtime_ns for c in simulations.glob("*/chunk-*.pt")}
    assert len(chunks) == 2, chunks

    # The same command again, on processes of its own (a second private Ray and Ray Train's
    # worker group: 72 s for the test alone, 53 s so): a checkpoint is the same whichever wrote it.
    again = subprocess.run(COMMAND, cwd=tmp_path, env=command_env(private_ray=False),
                           capture_output=True, text=True, timeout=400)  # fmt: skip
    out = again.stdout + again.stderr
    assert again.returncode == 0, out[-4000:]
    assert "this run's workers are processes of this command" in out, out[-4000:]
    epoch = killed_at // STEPS_PER_EPOCH  # checkpoints are taken at epoch ends
    assert f"resuming at epoch {epoch + 1} step {killed_at};" in out, out[-4000:]
    assert "[trainforge] simulations: reusing " in out and "to simulate" not in out, out
    assert {c.name: c.stat().st_mtime_ns for c in simulations.glob("*/chunk-*.pt")} == chunks
    assert f"[trainforge] finished at step {FINAL_STEP} " in out, out[-4000:]
    assert newest_step(run_dir) == FINAL_STEP
    assert not lock.exists()  # taken over, then released

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("trainforge")
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id], f"tags.`trainforge.run_name` = '{NAME}'")
    assert len(runs) == 1, [run.info.run_id for run in runs]  # reopened, not a second one
    assert f"run {runs[0].info.run_id} reopened" in out
    assert runs[0].info.status == "FINISHED"
    assert runs[0].data.metrics["epoch"] == EPOCHS


def _name(process: psutil.Process) -> str:
    """The process's name, or "" for one that ended since it was listed."""
    try:
        return process.name()
    except psutil.NoSuchProcess:
        return ""
