"""The run's system metrics (``tracking/system_metrics.py``): a run that ends inside the first
sampling interval still has the sample MLflow's thread took at its start."""

from __future__ import annotations

import time
from pathlib import Path

from mlflow.tracking import MlflowClient

from tests.unit.test_tracking_relay import _run
from trainforge.tracking import system_metrics


def test_a_run_shorter_than_one_interval_has_its_one_sample(tmp_path: Path) -> None:
    _, handle = _run(tmp_path)
    monitor = system_metrics.start(handle, 60.0, node=0)  # a first publish a minute away
    assert monitor is not None
    time.sleep(0.5)  # the thread has taken its first sample and waits out the interval
    system_metrics.stop_soon(monitor)
    client = MlflowClient(handle.tracking_uri)
    metrics = client.get_run(str(handle.run_id)).data.metrics
    [key] = [k for k in metrics if k.startswith("system/node_0/cpu_utilization")]
    assert [m.step for m in client.get_metric_history(str(handle.run_id), key)] == [0]
