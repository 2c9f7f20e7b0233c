"""Ray Train's process group without torch where nothing trains (``trainforge.process_group``):
the driver builds Ray Train's trainer without importing torch, and a worker's process group
starts from the rendezvous variables and ends as Ray's backend ends it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest
import torch.distributed as dist

from trainforge import process_group


def test_the_trainer_and_its_config_import_no_torch() -> None:
    # what the driver and Ray Train's controller hold: the trainer class, the backend config
    # and the backend it names; a fresh interpreter, since this one has torch already
    code = (
        "import sys\n"
        "from trainforge import ray_compat\n"
        "from trainforge.process_group import ProcessGroupConfig\n"
        "ray_compat.trainer_class()\n"
        "config = ProcessGroupConfig(backend='nccl', timeout_s=60)\n"
        "assert config.backend_cls.__name__ == '_ProcessGroupBackend'\n"
        "assert config.to_dict() == {'backend': 'nccl', 'init_method': 'env', 'timeout_s': 60}\n"
        "print(config.framework, 'torch' in sys.modules)\n"
    )
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["TrainingFramework.TORCH", "False"]


def test_a_process_group_starts_from_the_rendezvous_and_ends(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(port))
    process_group._start_process_group(backend="gloo", world_rank=0, world_size=1, timeout_s=30)
    try:
        assert dist.is_initialized()
        assert (dist.get_backend(), dist.get_world_size()) == ("gloo", 1)
    finally:
        process_group._end_process_group(destroy=True)
    assert not dist.is_initialized()
