"""MLflow's system metrics (CPU, memory, GPU) for a run: sampled by a thread of MLflow's in the
process that starts it, on its node. A rank's process where rank 0 talks to MLflow itself
(``tracking/worker.py``); the command where it sends rank 0's records (``tracking/relay.py``)."""

from __future__ import annotations

from typing import Any

from trainforge.log import warn
from trainforge.tracking.client import RunHandle


def start(handle: RunHandle, interval_s: float, node: int) -> Any:
    """MLflow's monitor, sampling every ``interval_s`` into the run as ``node_<node>``; None
    where it cannot run (psutil missing, NVML absent…): training goes on."""
    try:
        from mlflow.system_metrics.system_metrics_monitor import SystemMetricsMonitor

        monitor = SystemMetricsMonitor(
            handle.run_id,
            sampling_interval=interval_s,
            resume_logging=handle.resumed,
            node_id=f"node_{node}",
            tracking_uri=handle.tracking_uri,
        )
        monitor.start()
        return monitor
    except Exception as exc:
        warn(f"system metrics are off on node {node}: {exc}")
        return None


def stop_soon(monitor: Any, wait_s: float = 0.3) -> None:
    """Stop MLflow's system-metrics thread without waiting out its last round: on being told
    to stop it asks the run's status through a new MLflow client (for a SQLite store ~2 s of
    engine and schema checks) before it exits — time every command's end paid. It is a daemon
    thread: where it has not exited by then, its last sample is lost. Relies on the monitor's
    private ``_shutdown_event``, ``_process`` and ``monitors`` (MLflow 3.17)."""
    monitor._shutdown_event.set()
    thread = monitor._process
    if thread is not None:
        thread.join(wait_s)
    if thread is None or not thread.is_alive():
        _publish_last_sample(monitor)
        monitor.mlflow_logger.flush()  # what it sampled and had not sent yet


def _publish_last_sample(monitor: Any) -> None:
    """The sample the thread took and, told to stop during its interval, did not publish: the
    only one of a run shorter than one interval (the digits recipe's end comes ~1 s after its
    rank 0 starts writing, the default interval is 2 s), which would otherwise show none."""
    try:
        if all(part._metrics for part in monitor.monitors):
            monitor.publish_metrics(monitor.aggregate_metrics())
    except Exception as exc:  # the run's end goes on without it
        warn(f"the last system-metrics sample was not logged: {exc}")
