"""Warm workers on GPUs (``driver/warm_pool.py``): ``trainforge train`` commands on the lasting
local cluster of a GPU machine. The first command starts a worker per GPU, bound to it; the
next finds them warm and trains over a new NCCL group, and a third with one worker finds GPU 0's;
all train the graphed ResNet-18 step.
Skipped without CUDA."""

from __future__ import annotations

import re
import subprocess
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
        first, second, alone = consoles
        assert f"workers: starting {workers} (they stay warm for later runs)" in first
        assert f"workers: {workers} started {where}" in first
        assert "workers: starting" not in second
        assert f"workers: {workers} warm {where}" in second
        assert "workers: 1 warm on GPU 0, nccl, process group up (" in alone
    finally:
        subprocess.run([*trainforge(), "cluster", "stop"], env=env_for(home), timeout=120)
