"""GPU tier: a tracked run on a GPU records the GPU model and NVML system metrics."""

from __future__ import annotations

from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from trainforge import config
from trainforge.driver import launch
from trainforge.tracking.client import resolve_uri

pytestmark = [pytest.mark.gpu, pytest.mark.ray]

DIGITS = Path(__file__).resolve().parents[2] / "recipes" / "cnn" / "digits_simple_cnn.yaml"


def test_gpu_run_logs_gpu_system_metrics(ray_cluster, in_tmp: Path) -> None:
    cfg = config.load(
        DIGITS,
        ["run.name=gpu-tracked", "scaling.num_workers=1", "scaling.use_gpu=true",
         "train.epochs=60", "tracking.system_metrics_interval_s=1", "tracking.log_model=false"],
    )  # fmt: skip
    outcome = launch.train(cfg)
    assert outcome.exit_code == 0 and outcome.backend == "nccl"
    run = MlflowClient(tracking_uri=resolve_uri(None)).get_run(outcome.mlflow_run_id)
    assert "H100" in run.data.tags["gpu"] or "H200" in run.data.tags["gpu"]
    keys = set(run.data.metrics)
    assert "sys/gpu_mem_gb" in keys
    assert any(k.startswith("system/node_0/gpu_0_") for k in keys), sorted(keys)
    print(sorted(k for k in keys if k.startswith("system/")))
