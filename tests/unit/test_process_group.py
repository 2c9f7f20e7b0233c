"""The one process-group join (``trainforge.worker.process_group``) and Ray Train's backend
over it without torch where nothing trains (``driver/workers/ray_train_backend.py``): the driver
builds Ray Train's trainer without importing torch, and a worker joins from rank 0's address,
with the torch.distributed variables set, and leaves."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch.distributed as dist

from trainforge.worker import process_group
from trainforge.worker.process_group import Place


def test_the_trainer_and_its_config_import_no_torch() -> None:
    # what the driver and Ray Train's controller hold: the trainer class, the backend config
    # and the backend it names; a fresh interpreter, since this one has torch already
    code = (
        "import sys\n"
        "from trainforge import ray_compat\n"
        "from trainforge.driver.workers.ray_train_backend import ProcessGroupConfig\n"
        "ray_compat.trainer_class()\n"
        "config = ProcessGroupConfig(backend='nccl', timeout_s=60)\n"
        "assert config.backend_cls.__name__ == '_ProcessGroupBackend'\n"
        "assert config.to_dict() == {'backend': 'nccl', 'init_method': 'env', 'timeout_s': 60}\n"
        "print(config.framework, 'torch' in sys.modules, 'omegaconf' in sys.modules)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["TrainingFramework.TORCH", "False", "False"]


def test_a_worker_joins_from_rank_0s_address_and_leaves(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK",
                 "MASTER_ADDR", "MASTER_PORT"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)  # restored after the test
    process_group.join("gloo", Place.on_one_machine(0, 1), ("127.0.0.1", port), timeout_s=30)
    try:
        assert dist.is_initialized()
        assert (dist.get_backend(), dist.get_world_size()) == ("gloo", 1)
        assert (os.environ["MASTER_PORT"], os.environ["LOCAL_WORLD_SIZE"]) == (str(port), "1")
    finally:
        process_group.leave()
    assert not dist.is_initialized()


def test_a_place_tells_a_worker_what_torchrun_and_ray_train_tell_it() -> None:
    assert Place(5, 8, 1, 4, 1).env() == {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                                          "LOCAL_WORLD_SIZE": "4", "NODE_RANK": "1"}  # fmt: skip
    assert Place.on_one_machine(1, 2) == Place(1, 2, 1, 2, 0)
