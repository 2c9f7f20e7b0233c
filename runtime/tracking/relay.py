"""Rank 0's tracking records, sent to MLflow by the command: rank 0 then imports no MLflow.

Where rank 0 runs on the command's node — the command's own processes, warm workers, and Ray
Train's rank 0 where Ray placed it there — the command makes the MLflow run on a thread while
the workers start (``RunInTheMaking``): their run does not wait for it. Rank 0 writes what it
would send (metric rows at each commit, its tags, the dataset input, artifacts) to
``tracking-relay.jsonl`` in the run folder, in the spool's format (``tracking/spool.py``), and
once the run exists a thread of the command sends each record as it comes. The command samples
the system metrics too, and logs the final model, which rank 0 keeps beside the relay's files
(``keep_handed_model``: the module, or a workload's own flavour's logging function and its
files). Why: MLflow in rank 0 put a cold one-GPU command's first step ~5 s later — its import
and store before the setup could end, then its system-metrics monitor — and its import at the
end made the run's end as much longer. Where the workers take every core (two on a 2-core CPU),
rank 0 made the run before the first step while the other worker's core stood idle; beside the
workers the first step came 2.0 s sooner and the whole command 1.0 s.

Ray Train's rank 0 says it relays by writing here, and the command's system metrics of node 0
begin then; a rank 0 that Ray placed on another node sends its records itself, with the run
handed over through Ray (``tracking.worker.handed_over``), and samples its node.

A commit is then the file's fsync: a crash loses nothing a checkpoint covers. What was sent is
counted in ``tracking-relay.offset``; what the command could not send goes to the spool, for
``trainforge tracking-sync``. A command killed before it sent everything leaves both files: the
next command of the run sends the rest, or spools it where it does not relay.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from trainforge.atomic import replacing
from trainforge.log import first_line, warn
from trainforge.tracking import model_logging, system_metrics
from trainforge.tracking.client import RunHandle, redact
from trainforge.tracking.spool import Spool, send

RELAY_FILE = "tracking-relay.jsonl"
HANDED_MODEL = "handed-model.pickle"  # rank 0's final model, beside the relay's files
POLL_S = 0.5  # how soon a committed record reaches MLflow
STOP_WAIT_S = 15.0  # at the end: how long the last records may take to send
MAX_DELAY_S = 30.0  # the longest wait between attempts while MLflow does not answer


def relay_path(run_dir: Path) -> Path:
    return run_dir / RELAY_FILE


def offset_path(path: Path) -> Path:
    return path.with_suffix(".offset")


def files_folder(path: Path) -> Path:
    """Where the files of artifact records wait until they are sent."""
    return path.parent / "tracking-relay-files"


class Relay(threading.Thread):
    """Sends the records appended to ``handle.relay_path``, in order, from where an earlier
    command of the run stopped; the run's system metrics, sampled here, with
    ``system_metrics_s`` (None: none), from the start, or, with ``monitor_once_past``, once
    the relay file has grown past that many bytes (rank 0 relays: it runs on this node)."""

    def __init__(
        self,
        handle: RunHandle,
        system_metrics_s: float | None,
        model_imports: tuple[str, ...] = (),
        monitor_once_past: int | None = None,
        leftover_end: int = 0,
    ) -> None:
        super().__init__(name="trainforge-tracking-relay", daemon=True)
        from mlflow.tracking import MlflowClient

        assert handle.run_id is not None and handle.relay_path is not None
        self.handle = handle
        self.run_id: str = handle.run_id
        self.path = Path(handle.relay_path)
        self.client = MlflowClient(tracking_uri=handle.tracking_uri)
        self.offset = _sent_bytes(self.path)
        # What an earlier command of the run wrote and did not send ends at ``leftover_end``:
        # sent as it is, and the steps it holds are not sent again from this command's records
        self.leftover_end = leftover_end
        self.logged_through = handle.logged_through
        self.stopping = threading.Event()
        self.failing = False
        self.abandoned = False  # stop() gave up waiting: what is left is spooled, not sent
        self.monitor = None
        self.system_metrics_s, self.monitor_once_past = system_metrics_s, monitor_once_past
        if system_metrics_s is not None and monitor_once_past is None:
            self.monitor = system_metrics.start(handle, system_metrics_s, node=0)
        if model_imports:  # the model's logging's imports while the workers train, not after
            threading.Thread(target=_import_all, args=(model_imports,), name="model-imports",
                             daemon=True).start()  # fmt: skip

    def run(self) -> None:
        delay = POLL_S
        while True:
            last_pass = self.stopping.is_set()  # set after the workers ended: all is written
            if not last_pass:
                self._monitor_once_written()
            sent = self._send_new()  # else back off: 1, 2, 4 … 30 s between attempts
            delay = POLL_S if sent else min(max(delay * 2, 1.0), MAX_DELAY_S)
            if last_pass or (self.stopping.wait(delay) and self.failing):
                return

    def _monitor_once_written(self) -> None:
        """The system metrics of node 0 begin once rank 0 has written here: it runs on this
        node (before, it may be elsewhere and sample its own)."""
        if self.monitor_once_past is None or self.system_metrics_s is None:
            return
        if size(self.path) > self.monitor_once_past:
            self.monitor_once_past = None
            self.monitor = system_metrics.start(self.handle, self.system_metrics_s, node=0)

    def _send_new(self) -> bool:
        """Send every whole line written since the last pass; False when MLflow failed."""
        if not self.path.exists():
            return True
        with self.path.open("rb") as stream:
            stream.seek(self.offset)
            written = stream.read()
        sent = 0
        try:
            for line in written.splitlines(keepends=True):
                if not line.endswith(b"\n") or self.abandoned:
                    break  # being written: the next pass sends it
                if line.strip():
                    self._send(json.loads(line), self.offset + sent < self.leftover_end)
                sent += len(line)
        except Exception as exc:
            if not self.failing:
                warn(f"MLflow at {redact(self.handle.tracking_uri)} stopped answering "
                     f"({first_line(exc)}); retrying in the background, training goes on",
                     key="relay")  # fmt: skip
            self.failing = True
            return False
        finally:
            if sent and not self.abandoned:
                self.offset += sent
                _write_sent_bytes(self.path, self.offset)
        self.failing = False
        return True

    def _send(self, record: dict[str, Any], leftover: bool = False) -> None:
        if leftover and record["kind"] == "metrics":
            steps = [row[3] for row in record["metrics"]]
            self.logged_through = max([self.logged_through, *steps])
            send(self.client, self.run_id, record)
            return
        if record["kind"] != "artifact":
            send(self.client, self.run_id, record, self.logged_through)
            return
        kept = Path(str(record["local_path"]))
        if not kept.exists():  # a later file of the same name was sent in its place
            warn(f"{kept.name} was not in {kept.parent} to send to MLflow; left out")
            return
        send(self.client, self.run_id, record)
        kept.unlink()

    def log_kept_model(self) -> None:
        """The final model rank 0 kept for this command (``keep_handed_model``), logged from
        here, where MLflow is imported, not in rank 0 after its loop; nothing where it kept
        none."""
        kept = files_folder(self.path) / HANDED_MODEL
        if kept.exists() and model_logging.log_handed(self.handle, kept.read_bytes()):
            kept.unlink()
        spool_kept_model(self.path, self.handle)  # one MLflow did not take

    def stop(self) -> None:
        """After the workers ended: send what is left (``STOP_WAIT_S`` at most; nothing more
        while MLflow fails), then remove the relay's files, or spool what was not sent."""
        self.stopping.set()  # a failing thread ends at once, between its attempts
        self._stop_monitor()
        self.join(timeout=STOP_WAIT_S)
        if self.is_alive():  # stuck inside a request: the record it holds may reach both
            self.abandoned = True
        self._stop_monitor()  # one the thread started as this began
        spool_rest(self.path, Path(self.handle.spool_path), self.offset)

    def _stop_monitor(self) -> None:
        if self.monitor is not None:
            system_metrics.stop_soon(self.monitor)
            self.monitor = None


def spool_rest(path: Path, spool: Path, offset: int | None = None) -> int:
    """The records of the relay file ``path`` past ``offset`` (default: as its offset file
    says) appended to the spool file ``spool``; the relay's files removed. Returns how many."""
    if not path.exists():
        return 0
    offset = _sent_bytes(path) if offset is None else offset
    with path.open("rb") as stream:
        stream.seek(offset)
        rest = [line for line in stream.read().splitlines(keepends=True) if line.strip()]
    whole = [line if line.endswith(b"\n") else line + b"\n" for line in rest]
    if whole:
        spool.parent.mkdir(parents=True, exist_ok=True)
        with spool.open("ab") as out:
            out.writelines(whole)
        warn(f"{len(whole)} tracking records could not be sent; kept in {spool} for "
             "`trainforge tracking-sync`", key="relay-spooled")  # fmt: skip
    path.unlink()
    offset_path(path).unlink(missing_ok=True)
    if not whole:  # an artifact spooled keeps its file where its record points
        shutil.rmtree(files_folder(path), ignore_errors=True)
    return len(whole)


def spool_kept_model(path: Path, handle: RunHandle) -> None:
    """The final model rank 0 kept beside the relay file ``path``, where MLflow could not take
    it: moved beside the spool, with a record that logs it at `trainforge tracking-sync`."""
    kept = files_folder(path) / HANDED_MODEL
    if not kept.exists():
        return
    spool = Spool.of(handle)
    target = Path(handle.spool_path).parent / SPOOLED_FILES / f"model-{time.time_ns()}.pickle"
    target.parent.mkdir(parents=True, exist_ok=True)
    kept.replace(target)
    spool.write("model", local_path=str(target))
    warn(f"the model could not be logged to MLflow; kept in {target.parent} for `trainforge "
         "tracking-sync`", key="model-spooled")  # fmt: skip


SPOOLED_FILES = "tracking-spool-files"


def _import_all(modules: tuple[str, ...]) -> None:
    for name in modules:
        with contextlib.suppress(Exception):  # the model's logging meets any problem itself
            model_logging.import_for_logging(name)


def size(path: Path) -> int:
    """The relay file's size now (0 where there is none): measured before a command's workers
    start, it is where what an earlier command left unsent ends."""
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _sent_bytes(path: Path) -> int:
    try:
        return int(offset_path(path).read_text())
    except (OSError, ValueError):
        return 0


def _write_sent_bytes(path: Path, offset: int) -> None:
    with replacing(offset_path(path)) as temporary:
        temporary.write_text(str(offset))


def start(
    handle: RunHandle,
    run_dir: Path,
    system_metrics_s: float | None,
    model_imports: tuple[str, ...] = (),
    monitor_once_past: int | None = None,
    leftover_end: int = 0,
) -> Relay:
    """The relay of this command's run: ``handle.relay_path`` set (the workers' handle must
    be taken after this), its thread started; ``model_imports``, what the model's logging
    will import, imported meanwhile; ``monitor_once_past``: as ``Relay`` takes it."""
    handle.relay_path = str(relay_path(run_dir))
    relay = Relay(handle, system_metrics_s, model_imports, monitor_once_past, leftover_end)
    relay.start()
    return relay


def keep_handed_model(relay_file: str, handed: bytes) -> None:
    """Rank 0, which relays: the model it hands over (``model_logging.handed_over``), kept
    beside the relay's files for ``Relay.log_kept_model`` (the same on every worker path: Ray
    Train hands the command no result of a worker's)."""
    kept = files_folder(Path(relay_file)) / HANDED_MODEL
    kept.parent.mkdir(parents=True, exist_ok=True)
    with replacing(kept) as temporary:
        temporary.write_bytes(handed)


class RunInTheMaking(threading.Thread):
    """The MLflow run of a command whose own workers' rank 0 writes to the relay file: made on
    this thread (``make``, the run's start) while the workers start and train, and relayed once
    it exists. Rank 0 needs no run to write its records, so the workers' run never waits for
    MLflow: on this project's 2-core CPU, where both cores take a worker, the run's making (its
    import, its store) came between the workers' imports and their first step, with one core
    idle. ``for_workers``: the handle rank 0 is given (no run id; the relay file).

    ``hand_over``, for Ray Train's workers, where rank 0 may run on another node and send its
    own records: given the run once made (or, where that failed, the handle that spools),
    before the relay starts; node 0's system metrics then begin once rank 0 writes here."""

    WAIT_S = 60.0  # at the end: how long the run's making may still take (MLflow's timeouts)

    def __init__(
        self,
        make: Callable[[], RunHandle],
        for_workers: RunHandle,
        system_metrics_s: float | None,
        model_imports: tuple[str, ...],
        hand_over: Callable[[RunHandle], None] | None = None,
        leftover_end: int | None = None,
    ) -> None:
        super().__init__(name="trainforge-mlflow-run", daemon=True)
        self.make, self.for_workers, self.hand_over = make, for_workers, hand_over
        self.path = Path(str(for_workers.relay_path))
        self.system_metrics_s, self.model_imports = system_metrics_s, model_imports
        # what an earlier command of the run left unsent: measured before rank 0 writes (here,
        # or by the command where the run is made elsewhere: ``leftover_end``)
        self.leftover_end = size(self.path) if leftover_end is None else leftover_end
        self.monitor_once_past = None if hand_over is None else self.leftover_end
        self.handle: RunHandle | None = None
        self.relay: Relay | None = None
        # set when the command was interrupted and said so: the run, made after that, is made
        # without its phase line (the interruption's line stays the console's last)
        self.quiet = threading.Event()

    def run(self) -> None:
        try:
            handle = self.make()
        except Exception as exc:  # the run's start spools by itself; anything else is said
            warn(f"the MLflow run could not be started ({first_line(exc)}); its records are "
                 f"kept in {self.for_workers.spool_path}")  # fmt: skip
            if self.hand_over is not None:
                self.hand_over(dataclasses.replace(self.for_workers, relay_path=None))
            return
        self.handle = handle
        if self.hand_over is not None:  # a copy: the relay names its file in the handle
            self.hand_over(dataclasses.replace(handle))
        if handle.run_id is not None:
            self.relay = start(handle, self.path.parent, self.system_metrics_s,
                               self.model_imports, self.monitor_once_past,
                               self.leftover_end)  # fmt: skip

    def made(self) -> tuple[RunHandle | None, Relay | None]:
        """After the workers' run: the run's handle (None: it could not be started) and its
        relay (None: MLflow was unreachable at the start; stopped with ``stop``)."""
        self.join(self.WAIT_S)
        return self.handle, self.relay

    def stop(self) -> None:
        """Rank 0's last records sent, or spooled where the run was never made."""
        if self.relay is not None:
            self.relay.stop()
        else:
            spool_rest(self.path, Path(self.for_workers.spool_path))
