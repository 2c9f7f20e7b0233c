"""Shared test setup: one thread per process (2-core CI machines), no MLflow telemetry, and one
local Ray instance per test process, shared by the tests marked ``ray`` that run in it (with
``-n 2`` each xdist worker has its own, and Ray tests run on both workers at once; grouping
them onto one worker would put most of the suite's time on it). Tests that share a costly
module fixture carry an ``xdist_group`` of their own, so that with ``--dist loadgroup`` one
worker makes it once."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Before torch or ray are imported anywhere: OpenMP's default of 2 threads on 2 cores makes
# small matmuls 100x slower whenever another process is busy.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# A `trainforge` command run by a test gets a private Ray that ends with it, never the user's
# lasting local cluster, and trains there on Ray Train's workers (or on this session's Ray where
# a test joined it); tests of the other worker groups ask for theirs
# (tests/integration/test_worker_groups.py, test_local_cluster.py in a home of its own).
os.environ.setdefault("TRAINFORGE_WORKERS", "private")

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


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> pytest.TestReport:
    """A failed test that used this process's Ray carries the last lines its GCS and this
    driver's core worker logged: in one CI run a test's first ``ray.cluster_resources()``
    waited 15 min for a live GCS that never answered, and nothing else was left to read."""
    report: pytest.TestReport = yield
    if report.failed and report.when == "call" and "ray_cluster" in item.fixturenames:
        report.sections.append(("this test process's Ray, last lines", _ray_log_tails()))
    return report


def _ray_log_tails(lines: int = 15) -> str:
    import ray
    from ray._private import worker

    node = worker._global_node
    if not ray.is_initialized() or node is None:
        return "Ray is not initialized in this process"
    logs = Path(node.get_logs_dir_path())
    said = [f"session {node.get_session_dir_path()}"]
    for log in [logs / "gcs_server.out", *logs.glob(f"python-core-driver-*_{os.getpid()}.log")]:
        text = log.read_text(errors="replace") if log.is_file() else ""
        # the timestamped lines only: the periodic event statistics between them are long,
        # and their headers alone show whether the process still ran its loop
        stamped = [line for line in text.splitlines() if line.startswith("[")]
        said += [f"--- {log.name}", *stamped[-lines:]]
    return "\n".join(said)


@pytest.fixture(autouse=True)
def warnings_unsaid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test starts as a new command would, with none of ``log.warn``'s once-per-process
    warnings said yet: left from an earlier test in the same xdist worker, one was silently
    skipped, and a test that waited for it failed or passed by the order tests ran in."""
    from trainforge import log

    monkeypatch.setattr(log, "_warned", set())


WRITTEN_BY_A_RUN = ("mlruns", "mlartifacts", "mlflow.db", "runs")
"""What MLflow and a run write into the folder a process runs in; pytest runs in the
repository, where MLflow's default artifact root (``./mlruns``) is the repository's."""


@pytest.fixture(autouse=True)
def repository_left_clean() -> Iterator[None]:
    """No test writes a run's or MLflow's files into the repository: a test that made one of
    them there, where there was none, fails (with ``-n 2``, it or one running beside it). A
    checkout that has them already, from commands run in it, is not checked."""
    absent = [name for name in WRITTEN_BY_A_RUN if not os.path.lexists(ROOT / name)]
    yield
    made = [name for name in absent if os.path.lexists(ROOT / name)]
    assert not made, f"the test wrote {', '.join(made)} into the repository ({ROOT})"


@pytest.fixture
def importable_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[[str, str], str]]:
    """``write(prefix, source)``: a module of a user's written into the test's folder and
    importable by the name it returns for the test's length. The name is the test's own, so a
    module an earlier test imported is never the one found."""
    made: list[str] = []

    def write(prefix: str, source: str) -> str:
        name = f"{prefix}_{tmp_path.name.replace('-', '_')}"
        (tmp_path / f"{name}.py").write_text(source)
        monkeypatch.syspath_prepend(str(tmp_path))
        made.append(name)
        return name

    yield write
    for name in made:
        sys.modules.pop(name, None)


@pytest.fixture
def in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Run in a fresh directory: runs/ and mlflow.db land there."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path
