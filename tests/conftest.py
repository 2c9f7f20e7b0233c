"""Shared test setup: one thread per process (2-core CI machines), no MLflow telemetry, and one
local Ray instance per test process, shared by the tests marked ``ray`` that run in it (with
``-n 2`` each xdist worker has its own, and Ray tests run on both workers at once; grouping
them onto one worker would put most of the suite's time on it). Tests that share a costly
module fixture carry an ``xdist_group`` of their own, so that with ``--dist loadgroup`` one
worker makes it once."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Before torch or ray are imported anywhere: OpenMP's default of 2 threads on 2 cores makes
# small matmuls 100x slower whenever another process is busy.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# A `trainforge` command run by a test gets a private Ray that ends with it, never the user's
# lasting local cluster; tests/integration/test_local_cluster.py tests that one in its own home.
os.environ.setdefault("TRAINFORGE_KEEP_CLUSTER", "0")

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    import torch

    has_gpu = torch.cuda.is_available()
    for item in items:
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU (run on the GPU machine)"))


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray for the whole session (ray.init costs ~5 s on 2 cores)."""
    import ray

    from trainforge.driver.cluster import connect

    # never join a `ray start` cluster another test is running; the runtime's own connect, so
    # this session's runs are pinned to this cluster (xdist runs one cluster per test process)
    connect(local_only=True, num_cpus=max(2, os.cpu_count() or 2))
    yield ray
    ray.shutdown()


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in a fresh directory: runs/ and mlflow.db land there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path
