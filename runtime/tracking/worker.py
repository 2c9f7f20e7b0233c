"""MLflow tracking inside the workers: rank 0's metrics and artifacts, every node's system
metrics.

Metrics are buffered and committed when a checkpoint is saved (and at the end): a run that
crashes and resumes from its last checkpoint re-does exactly the steps whose metrics were not
committed, so the metric history has no gap and no repeated step. A background thread does the
sending; the training thread only appends to a list. When the server is down, the sender keeps
retrying; what is still unsent at the end goes to the spool (``tracking/spool.py``).

Where the command sends rank 0's records (``tracking/relay.py``), rank 0 imports no MLflow: its
records go to a file in the run folder and its final model to the command. Else the run's end
imports what it needs (MLflow's pytorch flavour; matplotlib for SBI's figures) after the loop.
A thread importing them while the loop ran saved the end as much as it cost the loop: the
loop's thread waits for Python's lock each time it gives it up (every wait for the GPU), and on a
GPU the thread held back the CUDA-graph capture, the first step ~3 s later on one H200.
"""

from __future__ import annotations

import contextlib
import json
import queue
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainforge.distributed import WorkerContext, all_gather_objects
from trainforge.log import first_line, warn
from trainforge.tracking import model_logging, relay, system_metrics
from trainforge.tracking.client import (
    RunHandle,
    after,
    configure_client_env,
    open_store,
    redact,
)
from trainforge.tracking.datasets import TrainingData
from trainforge.tracking.spool import Spool

MetricRow = model_logging.MetricRow  # key, value, timestamp ms, step
COMMIT_WAIT_S = 2.0  # how long a checkpoint waits for its metrics to be acknowledged
CLOSE_WAIT_S = 15.0


class Sender(threading.Thread):
    """Sends committed metric batches in order, retrying with backoff while the server is down."""

    def __init__(self, handle: RunHandle) -> None:
        super().__init__(name="trainforge-mlflow-sender", daemon=True)
        from mlflow.tracking import MlflowClient

        self.client = MlflowClient(tracking_uri=handle.tracking_uri)
        assert handle.run_id is not None, "a sender is made only for a run the server has"
        self.run_id: str = handle.run_id
        self.logged_through = handle.logged_through
        self.uri = redact(handle.tracking_uri)  # for messages
        self.batches: queue.Queue[list[MetricRow] | None] = queue.Queue()
        self.unsent: list[list[MetricRow]] = []
        self.idle = threading.Event()
        self.idle.set()
        self.stopping = threading.Event()
        self.failing = False  # the last attempt failed: nobody should wait on us

    def send(self, rows: list[MetricRow]) -> None:
        self.idle.clear()
        self.batches.put(rows)

    def run(self) -> None:
        from mlflow.entities import Metric

        while True:
            rows = self.batches.get()
            if rows is None:
                return
            delay = 1.0
            while True:
                try:
                    metrics = [Metric(*row) for row in after(rows, self.logged_through)]
                    for start in range(0, len(metrics), 1000):
                        self.client.log_batch(self.run_id, metrics=metrics[start : start + 1000])
                    rows = []
                    self.failing = False
                    break
                except Exception as exc:
                    self.failing = True
                    warn(f"MLflow at {self.uri} stopped answering ({exc}); retrying in the "
                         "background, training goes on", key="sender")  # fmt: skip
                    if self.stopping.wait(delay):
                        self.unsent.append(rows)
                        self._drain_unsent()
                        return
                    delay = min(delay * 2, 30.0)
            if self.batches.empty():
                self.idle.set()

    def _drain_unsent(self) -> None:
        while not self.batches.empty():
            rows = self.batches.get_nowait()
            if rows:
                self.unsent.append(rows)

    def stop(self, wait_s: float) -> list[list[MetricRow]]:
        """Give the queue ``wait_s`` seconds to empty; return what could not be sent."""
        if not self.failing:
            self.idle.wait(wait_s)
        self.stopping.set()
        self.batches.put(None)
        self.join(timeout=wait_s)
        if self.is_alive():  # stuck inside a request: whatever is queued counts as unsent
            self._drain_unsent()
        return [rows for rows in self.unsent if rows]


HANDOVER_WAIT_S = 300.0  # MLflow's own retries against a slow server end well before


def handed_over(
    handle: dict[str, Any] | None,
    handover_key: str | None,
    relay_node: str | None,
    ctx: WorkerContext,
    system_metrics: bool,
) -> dict[str, Any] | None:
    """The MLflow run's handle for this worker: the command's (``handle``: rank 0 then writes
    its records for the command to send, ``tracking/relay.py``), or, on Ray Train's workers,
    where this one talks to MLflow itself — rank 0 on another node than the command's
    (``relay_node``), or the first worker of a node, which samples its system metrics — the run
    the command hands over under ``handover_key`` through Ray's key-value store once it is made
    (``driver/mlflow_handover.py``), waited for if need be."""
    if handover_key is None or handle is None:
        return handle
    relays = ctx.is_main and relay_node == ctx.node_id
    monitors = system_metrics and ctx.local_rank == 0
    if relays or not (ctx.is_main or monitors):  # the rest take the command's and send nothing
        return handle
    from trainforge import ray_compat

    deadline = time.monotonic() + HANDOVER_WAIT_S
    while (value := ray_compat.kv_get(handover_key)) is None:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"the command did not hand over its MLflow run within {HANDOVER_WAIT_S:.0f} s"
            )
        time.sleep(0.05)
    return dict(json.loads(value))


class WorkerTracker:
    def __init__(self, handle: dict[str, Any] | None, section: Any, ctx: WorkerContext) -> None:
        self.ctx = ctx
        self.section = section
        self.handle = RunHandle(**handle) if handle else None
        self.logs_metrics = self.handle is not None and ctx.is_main
        # The command sends rank 0's records, samples the system and logs the model rank 0
        # hands it (tracking/relay.py): this process then imports no MLflow
        relayed = self.handle is not None and self.handle.relay_path is not None
        self.sends = self.logs_metrics and self.online and not relayed
        self.hands_off = self.logs_metrics and relayed
        self.monitors = (
            self.online and ctx.local_rank == 0 and section.system_metrics and not relayed
        )
        self.pending: list[MetricRow] = []
        self.latest: dict[str, MetricRow] = {}  # each metric's last row: the model's are linked
        self.sender: Sender | None = None
        self.system_monitor: Any = None
        self.busy_s = 0.0  # time the training thread spends in tracking calls
        self._warming: threading.Thread | None = None

    @property
    def online(self) -> bool:
        return self.handle is not None and self.handle.run_id is not None

    def prewarm(self) -> None:
        """Import MLflow and open its store on a background thread while the data and the
        model are built: ``start`` then finds both ready (MLflow keeps one store per URI in a
        process). Importing MLflow and opening a SQLite store cost ~1.7 s on a 2-core machine
        that every run's setup waited for. Only on the ranks that will talk to MLflow."""
        if not (self.sends or self.monitors):
            return
        uri, monitors = self._handle().tracking_uri, self.monitors

        def warm() -> None:
            with contextlib.suppress(Exception):  # start() meets any problem itself
                open_store(uri)
                if monitors:
                    import mlflow.system_metrics.system_metrics_monitor  # noqa: F401

        self._warming = threading.Thread(target=warm, name="mlflow-prewarm", daemon=True)
        self._warming.start()

    def start(self) -> None:
        """Every rank calls this (the node count needs a collective)."""
        if self._warming is not None:
            self._warming.join()
        node_ids = all_gather_objects(self.ctx.node_id, self.ctx.world_size)
        if self.handle is None:
            return
        configure_client_env()
        if self.monitors:
            handle, interval = self._handle(), self.section.system_metrics_interval_s
            self.system_monitor = system_metrics.start(handle, interval, self.ctx.node_rank)
        if not self.logs_metrics:
            return
        tags = {
            "world_size": str(self.ctx.world_size),
            "node_count": str(len(set(node_ids))),
            "device": self.ctx.device.type,
        }
        if self.ctx.device.type == "cuda":
            tags["gpu"] = torch.cuda.get_device_name(self.ctx.device)
        if self.sends:
            sender = self.sender = Sender(self.handle)
            sender.start()
            try:
                for key, value in tags.items():
                    sender.client.set_tag(sender.run_id, key, value)
            except Exception as exc:
                warn(f"could not tag the MLflow run ({exc}); training goes on")
                self._spool().write("tags", tags=tags)
        else:
            self._spool().write("tags", tags=tags)

    def log(self, metrics: dict[str, float], step: int) -> None:
        if not self.logs_metrics:
            return
        started = time.perf_counter()
        now = int(time.time() * 1000)
        rows = [(key, float(value), now, step) for key, value in metrics.items()]
        self.pending.extend(rows)
        self.latest.update((row[0], row) for row in rows)
        self.busy_s += time.perf_counter() - started

    @contextlib.contextmanager
    def committing(self, enabled: bool = True) -> Iterator[None]:
        """Around a checkpoint save: the metrics logged so far go out once the checkpoint is
        saved. A save that fails (a full disk) sends nothing: the resume recomputes those steps
        from the checkpoint before, and sends them then, once."""
        yield
        if enabled:
            self.commit()

    def commit(self, wait: bool = True) -> None:
        """The metrics logged so far are covered by a saved checkpoint: send them."""
        if not self.logs_metrics or not self.pending:
            return
        started = time.perf_counter()
        rows, self.pending = self.pending, []
        if self.sender is not None:
            self.sender.send(rows)
        else:
            self._spool().write("metrics", metrics=rows)
        self.busy_s += time.perf_counter() - started
        if wait:
            self.confirm()

    def confirm(self) -> None:
        """Wait briefly for the sender, so a crash right after a checkpoint cannot lose the
        metrics it covers — unless the server is down: training never waits on it."""
        if self.sender is None or self.sender.failing:
            return
        started = time.perf_counter()
        self.sender.idle.wait(COMMIT_WAIT_S)
        self.busy_s += time.perf_counter() - started

    def log_artifacts(self, files: list[Path], artifact_path: str) -> None:
        if not self.logs_metrics:
            return
        for path in files:
            if self.sender is not None:
                try:
                    self.sender.client.log_artifact(self.sender.run_id, str(path), artifact_path)
                    continue
                except Exception as exc:
                    warn(f"could not upload {path.name} to MLflow ({exc}); spooled")
            kept = self._spool_dir() / artifact_path / path.name
            kept.parent.mkdir(parents=True, exist_ok=True)
            kept.write_bytes(path.read_bytes())
            self._spool().write("artifact", local_path=str(kept), artifact_path=artifact_path)

    def log_training_data(self, data: TrainingData | None) -> None:
        """Rank 0, after ``start``: the training data as the run's dataset input (MLflow keeps
        one per name and digest, so a restart or a resumed run adds none)."""
        if data is None or not self.logs_metrics:
            return
        if self.sender is not None:
            try:
                data.log(self.sender.client, self.sender.run_id)
                return
            except Exception as exc:
                warn(
                    f"could not log the training data as an MLflow input ({first_line(exc)}); "
                    f"kept in {self._handle().spool_path} for `trainforge tracking-sync`"
                )
        self._spool().write("dataset", dataset=data.to_record())

    def log_model(
        self,
        model: nn.Module,
        example: torch.Tensor | None,
        custom: Callable[..., Any] | None = None,
        name: str = "model",
    ) -> None:
        """The final weights as a state dict, and as an MLflow model named ``name``: loadable
        with ``mlflow.pytorch.load_model`` (with its input example and explicit requirements),
        or as ``custom`` logs it (the workload's own flavour, e.g. SBI's posterior pyfunc);
        linked to the run's evaluation metrics (``model_logging.ModelRecord``)."""
        if not self.logs_metrics:
            return
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "state_dict.pt"
            torch.save(model.state_dict(), path)
            self.log_artifacts([path], "model_state")
        # a relayed run may not exist yet: the command logs the model if it does
        if not (self.section.log_model and (self.online or self.hands_off)):
            return
        record = model_logging.ModelRecord.of(name, self.latest)
        logged: nn.Module | None = None
        if custom is None:
            assert example is not None, "the pytorch flavour needs an input example"
            logged, example = model_logging.for_mlflow(model, example)
        if self.hands_off:  # the command logs it (tracking/relay.py)
            try:
                handed = model_logging.handed_over(logged, example, custom, record)
                relay.keep_handed_model(str(self._handle().relay_path), handed)
                return
            except Exception as exc:  # a flavour that cannot be pickled is logged here
                warn(f"the model is logged by rank 0: it cannot be handed over ({exc})")
        model_logging.log(self._handle(), logged, example, custom, record)

    @contextlib.contextmanager
    def model_folder(self) -> Iterator[Path]:
        """Where a workload writes its own flavour's files (``Workload.mlflow_model``): a
        temporary folder, or where the command logs the model, one beside the relay's files,
        which the command removes (``tracking/relay.py``)."""
        handle = self.handle
        if self.hands_off and handle is not None and handle.relay_path is not None:
            folder = relay.files_folder(Path(handle.relay_path)) / "model"
            folder.mkdir(parents=True, exist_ok=True)
            yield folder
            return
        with tempfile.TemporaryDirectory(prefix="trainforge-model-") as temporary:
            yield Path(temporary)

    def close(self) -> None:
        self.commit()
        if self.sender is not None:
            for rows in self.sender.stop(CLOSE_WAIT_S):
                self._spool().write("metrics", metrics=rows)
                warn(
                    f"{len(rows)} metric values could not be sent; kept in "
                    f"{self._handle().spool_path} for `trainforge tracking-sync`",
                    key="unsent",
                )
        if self.system_monitor is not None:
            system_metrics.stop_soon(self.system_monitor)
            self.system_monitor = None

    def _handle(self) -> RunHandle:
        assert self.handle is not None, "only called where tracking is on"
        return self.handle

    def _spool(self) -> Spool:
        """Where records go that this process does not send: the command's relay file, else
        the spool."""
        handle = self._handle()
        if handle.relay_path is not None:
            return Spool(handle.relay_path, handle.identity())
        return Spool.of(handle)

    def _spool_dir(self) -> Path:
        """Where the files of artifact records wait."""
        handle = self._handle()
        if handle.relay_path is not None:
            return relay.files_folder(Path(handle.relay_path))
        return Path(handle.spool_path).parent / "tracking-spool-files"
