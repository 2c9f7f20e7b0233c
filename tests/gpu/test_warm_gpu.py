"""Workers on GPUs without and with the lasting local cluster: the first command, with no cluster
running, trains on processes of its own (``driver/workers/own.py``), one per GPU, over NCCL, and
starts the cluster and a warm worker per GPU in the background (``driver/warm_pool.py``); the
next finds them warm and trains over a new NCCL group, and a third with one worker finds GPU 0's;
all train the graphed ResNet-18 step.
Skipped without CUDA."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import RECIPES
from tests.integration.test_local_cluster import env_for, trainforge

pytestmark = [pytest.mark.gpu, pytest.mark.ray]

BENCH = RECIPES / "cnn" / "synthetic_resnet18_bench.yaml"
SHORT = ["train.max_steps=40", "train.log_every_steps=20", "workload.synthetic_train_size=20480",
         "tracking.system_metrics=false"]  # fmt: skip


def test_warm_workers_serve_one_gpu_run_after_another_over_nccl(tmp_path: Path) -> None:
    gpus = torch.cuda.device_count()
    if gpus < 1:
        pytest.skip("needs a GPU")
    home = tmp_path / "home"
    workers = min(gpus, 2)
    names = ",".join(str(index) for index in range(workers))
    where = f"on GPU{'s' if workers > 1 else ''} {names}, nccl, process group up ("
    try:
        consoles = []
        # then one worker alone: a lone rank's NCCL group makes no communicator (it has no
        # collective to make), and the run trains as any other
        for name, count in (("first", workers), ("second", workers), ("alone", 1)):
            out = subprocess.run(
                [*trainforge(), "train", str(BENCH), f"run.name={name}",
                 f"scaling.num_workers={count}", "scaling.use_all_gpus=false", *SHORT],
                env=env_for(home), cwd=tmp_path, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            console = out.stdout + out.stderr
            assert out.returncode == 0, console
            assert list((tmp_path / "runs" / name).glob("checkpoint_*")), console
            assert re.search(r"val/loss\s+\d", console), console  # the closing table
            consoles.append(console)
            if name == "first":  # its background start of the cluster and its workers
                wait = "from trainforge.driver import background; assert background.wait(300)"
                waited = subprocess.run([sys.executable, "-c", wait], env=env_for(home))
                assert waited.returncode == 0
        first, second, alone = consoles
        assert (
            f"workers: starting {workers} on GPU{'s' if workers > 1 else ''} {names}, "
            "processes of this command" in first
        )
        assert f"workers: {workers} started {where}" in first
        assert f"ray: starting the local cluster and {workers} warm worker" in first
        assert "workers: starting" not in second
        assert f"workers: {workers} warm {where}" in second
        assert "workers: 1 warm on GPU 0, nccl, process group up (" in alone
    finally:
        subprocess.run([*trainforge(), "cluster", "stop"], env=env_for(home), timeout=120)


def test_a_gpu_worker_makes_its_cuda_context_with_one_work_queue() -> None:
    """``environment.GPU_WORKER_ENV`` is in the worker's environment before its CUDA context exists
    (own workers and warm workers are both ``WarmWorker``)."""
    if torch.cuda.device_count() < 1:
        pytest.skip("needs a GPU")
    code = (
        "import os, sys\n"
        "os.environ.pop('CUDA_DEVICE_MAX_CONNECTIONS', None)\n"
        "from trainforge.worker.warm import WarmWorker\n"
        "worker = WarmWorker(sys.path, os.getpid(), 60.0, '0')\n"
        "import torch\n"
        "print(torch.cuda.is_initialized(), os.environ['CUDA_DEVICE_MAX_CONNECTIONS'])\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split()[-2:] == ["True", "1"]
