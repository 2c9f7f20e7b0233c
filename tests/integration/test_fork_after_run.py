"""A process connected to Ray that has trained can fork (a multiprocessing Manager, a DataLoader
with workers in the notebook that ran the training). Ray Train's ``fit()`` left its SIGINT
handler installed, a closure over the run controller's actor handle; a forked child that
replaced the handler (a Manager's does) dropped that handle, its Ray reported the actor out of
scope over the parent's own GCS connection, and the parent's next Ray call never got an answer
(seen in CI, where a test's Manager forked the xdist worker after a training of an earlier test).

The training and the fork happen in a child of this test that joins the shared Ray: were the
connection broken, it would be that process's, not this test process's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import RECIPES

pytestmark = [pytest.mark.ray]

DIGITS = RECIPES / "cnn" / "digits_simple_cnn.yaml"
SCRIPT = """
import multiprocessing, os, signal, sys, threading
import ray

ray.init(address=sys.argv[1])
from trainforge import config
from trainforge.driver import launch

before = signal.getsignal(signal.SIGINT)
print("exit", launch.train(config.load(sys.argv[2], sys.argv[3:])).exit_code, flush=True)
print("handler", "kept" if signal.getsignal(signal.SIGINT) is before else "replaced", flush=True)
manager = multiprocessing.get_context("fork").Manager()  # its child ignores SIGINT
answered = threading.Event()
threading.Thread(target=lambda: (ray.cluster_resources(), answered.set()), daemon=True).start()
print("ray", "answered" if answered.wait(60) else "did not answer in 60 s", flush=True)
manager.shutdown()
os._exit(0)  # a broken connection must not hang the exit
"""


def test_a_process_that_trained_on_ray_can_fork(ray_cluster, in_tmp: Path) -> None:
    overrides = ["run.name=forked", "train.max_steps=4", "tracking.enabled=false"]
    address = ray_cluster.get_runtime_context().gcs_address
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, address, str(DIGITS), *overrides],
        capture_output=True, text=True, timeout=300,  # OMP_NUM_THREADS=1: conftest's
    )  # fmt: skip
    ours = ("exit ", "handler ", "ray ")  # the script's own lines among the run's
    said = [line for line in done.stdout.splitlines() if line.startswith(ours)]
    assert said == ["exit 0", "handler kept", "ray answered"], done.stdout + done.stderr[-3000:]
