"""The MLflow run made while Ray Train's workers start: rank 0 on the command's node relays
and waits for nothing; the workers that talk to MLflow themselves (rank 0 elsewhere, each
node's first worker for its system metrics) take the run handed over through Ray's key-value
store (``driver/mlflow_handover.py``, ``tracking.relay.RunInTheMaking``,
``tracking.worker.handed_over``)."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from trainforge import ray_compat
from trainforge.distributed import WorkerContext
from trainforge.driver.mlflow_handover import Handover
from trainforge.tracking import relay, worker
from trainforge.tracking.client import RunHandle

HERE, ELSEWHERE = "node-of-the-command", "another-node"


def handle(tmp_path: Path, run_id: str | None, relay_path: str | None = None) -> RunHandle:
    uri, spool = f"sqlite:///{tmp_path / 'mlflow.db'}", str(tmp_path / "spool.jsonl")
    return RunHandle(uri, "exp", "run", run_id, False, spool, relay_path)


def ctx(rank: int, local_rank: int, node_id: str) -> WorkerContext:
    return WorkerContext(rank, local_rank, 4, 0 if node_id == HERE else 1, torch.device("cpu"),
                         node_id)  # fmt: skip


def making(tmp_path: Path, make: Any, key: str) -> tuple[relay.RunInTheMaking, dict[str, Any]]:
    """The command's side: the run made on a thread, handed over under ``key``; what Ray
    Train's workers are given of it (``WorkerPayload``'s fields)."""
    for_workers = handle(tmp_path, None, str(tmp_path / relay.RELAY_FILE))
    handover = Handover(key)
    run = relay.RunInTheMaking(make, for_workers, None, (), handover)
    payload = {"handle": for_workers.for_workers(), "handover_key": key, "relay_node": HERE}
    return run, payload


def handed_over(payload: dict[str, Any], ctx: WorkerContext, system_metrics: bool) -> Any:
    return worker.handed_over(payload["handle"], payload.get("handover_key"),
                              payload.get("relay_node"), ctx, system_metrics)  # fmt: skip


def test_who_waits_for_the_run_and_who_relays(ray_cluster: Any, tmp_path: Path) -> None:
    release = threading.Event()

    def make() -> RunHandle:
        release.wait(10)  # the run is made only after the workers have asked for it
        return handle(tmp_path, "abc123")

    run, payload = making(tmp_path, make, "mlflow-run-test-late")
    run.start()
    # rank 0 on the command's node: the relay's handle at once; so for the ranks that send
    # nothing (not a node's first worker, or no system metrics)
    assert handed_over(payload, ctx(0, 0, HERE), True) == payload["handle"]
    assert handed_over(payload, ctx(1, 1, HERE), True) == payload["handle"]
    assert handed_over(payload, ctx(2, 0, ELSEWHERE), False) == payload["handle"]
    assert not release.is_set()

    # rank 0 elsewhere, and another node's first worker (its system metrics), wait for the run
    threading.Timer(0.5, release.set).start()
    started = time.monotonic()
    taken = handed_over(payload, ctx(0, 0, ELSEWHERE), True)
    assert time.monotonic() - started >= 0.4  # it waited
    assert taken == handle(tmp_path, "abc123").for_workers()  # no relay file: it sends itself
    assert handed_over(payload, ctx(2, 0, ELSEWHERE), True) == taken
    made, _ = run.made()
    assert made is not None and made.run_id == "abc123"
    run.stop()
    run.hand_over.close()  # type: ignore[union-attr]
    assert ray_compat.kv_get("mlflow-run-test-late") is None  # nothing left in Ray's store


def test_a_run_that_could_not_be_made_hands_over_the_handle_that_spools(
    ray_cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    def make() -> RunHandle:
        raise OSError("no space left on device")

    run, payload = making(tmp_path, make, "mlflow-run-test-failed")
    run.start()
    taken = handed_over(payload, ctx(0, 0, ELSEWHERE), True)
    assert taken["run_id"] is None and taken["relay_path"] is None  # rank 0 spools its records
    assert taken["spool_path"] == str(tmp_path / "spool.jsonl")
    assert "could not be started (no space left on device)" in capsys.readouterr().err
    assert run.made() == (None, None)
    run.stop()
    run.hand_over.close()  # type: ignore[union-attr]


def test_a_payload_without_a_handover_gives_its_own_handle() -> None:
    main = ctx(0, 0, ELSEWHERE)
    assert handed_over({"handle": {"run_id": "r"}}, main, True) == {"run_id": "r"}
    assert handed_over({"handle": None}, main, True) is None
