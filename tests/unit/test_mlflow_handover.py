"""The MLflow run made while Ray Train's workers start, handed to them through Ray's key-value
store (``driver/mlflow_handover.py``, ``tracking.worker.handed_over``)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from trainforge.driver.mlflow_handover import MlflowHandover
from trainforge.tracking import worker
from trainforge.tracking.client import HANDOVER_FIELD, RunHandle


def handle(run_id: str | None) -> RunHandle:
    return RunHandle("sqlite:////tmp/x.db", "exp", "run", run_id, False, "/tmp/spool.jsonl")


def test_a_worker_takes_the_run_made_after_it_asked(ray_cluster: Any) -> None:
    release = threading.Event()

    def make(quiet: threading.Event) -> RunHandle:
        release.wait(10)  # the run is made only after the worker has begun to wait for it
        return handle("abc123")

    handover = MlflowHandover(make, handle(None), "mlflow-run-test-late")
    handover.start()
    threading.Timer(0.5, release.set).start()
    started = time.monotonic()
    taken = worker.handed_over({HANDOVER_FIELD: handover.key, "mlflow": None})
    assert time.monotonic() - started >= 0.4  # it waited
    assert taken == handle("abc123").for_workers()
    assert handover.made() is handover.handle
    handover.close()
    from trainforge import ray_compat

    assert ray_compat.kv_get(handover.key) is None  # nothing left in Ray's store


def test_a_run_that_could_not_be_made_hands_over_the_offline_handle(
    ray_cluster: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    def make(quiet: threading.Event) -> RunHandle:
        raise OSError("no space left on device")

    handover = MlflowHandover(make, handle(None), "mlflow-run-test-failed")
    handover.start()
    taken = worker.handed_over({HANDOVER_FIELD: handover.key})
    assert taken is not None and taken["run_id"] is None  # the workers spool their records
    assert "could not be started (no space left on device)" in capsys.readouterr().err
    handover.close()


def test_a_payload_without_a_handover_gives_its_own_handle() -> None:
    assert worker.handed_over({"mlflow": {"run_id": "r"}}) == {"run_id": "r"}
    assert worker.handed_over({}) is None
