"""The command's own worker processes: a local command with no cluster to use starts its workers
itself, at once, and they import while it makes the data.

Why: with no Ray running, a command waited for the lasting cluster's start (`ray start`, 7.4 s
on a 2-core CPU, 7.7 s on a 16-core H100 host) and then for its warm workers' imports (13 s on
that host) before the first step. Training on one machine needs no cluster. The lasting cluster
starts in the background after the run, for later commands (``driver/background.py``), unless
none is kept (``TRAINFORGE_WORKERS=own``).

A worker is the warm pool's worker class (``worker/warm.py``) in a plain process
(``worker/own.py``): the same loop, the same process-group join on a TCP store on loopback,
checkpoints in the run folder, lines written to the run folder's console file. GPU workers take
the warm pool's slots, so two commands take different GPUs. A worker ends when its command
ends, even a SIGKILLed one (it checks that the command lives).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import IO, Any

from trainforge import log, settings, storage
from trainforge.config import Recipe
from trainforge.driver import cluster, console, local_cluster, warm_pool
from trainforge.driver.workers.base import (
    Failures,
    Finished,
    WorkerGroup,
    died,
    how_it_ended,
    run_imports,
)
from trainforge.worker.payload import WorkerPayload

STOP_WAIT_S = 5.0  # a worker asked to stop (SIGTERM) gets this long before SIGKILL
OTHERS_WAIT_S = 1.0
"""After a rank fails, how long the others' answers are awaited: a killed rank 0's peers fail
too (their collective's connection reset), and the rank whose process died must be the one
named."""


def unavailable(cfg: Recipe, storage_path: str) -> str | None:
    """Why this command cannot run on its own processes (None: it can). Checked before Ray:
    only a local command with no cluster to use qualifies."""
    if not settings.own_processes():
        return f"{settings.WORKERS.name}={settings.workers()}"
    if os.environ.get("RAY_ADDRESS"):
        return "RAY_ADDRESS names a cluster"
    if _connected_to_ray() and not cluster.started_private():
        return "this process is connected to Ray"
    if cfg.scaling.use_gpu != "false" and cfg.scaling.resources_per_worker.get("GPU", 1) != 1:
        return "workers of other than one GPU each"
    # Where a cluster is kept, a stage that needs one starts it, and its warm workers train;
    # where none is (``own``), the stage gets a private Ray and the run still trains on the
    # command's processes: Ray Train's controller and new workers would add ~15 CPU-s.
    if _needs_cluster(cfg) and settings.keeps_cluster():
        return "its data stage runs on the cluster"
    if storage.local_folder(storage_path) is None:
        return "remote storage"
    # While a background start readies the cluster's warm workers (their imports, their
    # rehearsal), a command that joined it would wait for them: it trains on its own processes,
    # and the background start waits for it (``background.yield_cores``).
    if (settings.keeps_cluster() and local_cluster.running() is not None
            and not local_cluster.background_start_running()):  # fmt: skip
        return "the local cluster runs"
    return None


def phase_line(cfg: Recipe) -> str:
    """The command's first line where its workers are its own processes."""
    if settings.keeps_cluster() and local_cluster.background_start_running():
        return ("ray: the local cluster is being readied in the background for later commands; "
                "this run's workers are processes of this command")  # fmt: skip
    if settings.keeps_cluster():
        return "ray: no local cluster runs; this run's workers are processes of this command"
    if _needs_cluster(cfg):
        return (f"ray: a private one for this command's data stage only "
                f"({settings.WORKERS.name}=own: nothing outlives it); this run's workers are "
                "processes of this command")  # fmt: skip
    return (f"ray: none for this command ({settings.WORKERS.name}=own: nothing outlives it); "
            "this run's workers are processes of this command")  # fmt: skip


def _connected_to_ray() -> bool:
    """Has this process joined a Ray cluster already (``ray.init`` in a notebook or a script
    that calls ``launch.train``)? Its run goes there. Ray is not imported to find out."""
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


def _needs_cluster(cfg: Recipe) -> bool:
    """Does the workload's data stage spread work over Ray?"""
    from trainforge.workloads import spec_for

    return spec_for(cfg.workload.kind).needs_cluster(cfg.workload)


def resources() -> dict[str, float]:
    """What this machine offers the run, counted as Ray would count it for a local cluster:
    the CPUs this process may use, the GPUs it sees."""
    return {"CPU": float(len(os.sched_getaffinity(0))), "GPU": float(len(visible_gpus()))}


def visible_gpus() -> list[str]:
    """The GPUs a new process would see: CUDA_VISIBLE_DEVICES where set, else every NVIDIA GPU
    of the machine (as the driver lists them; no CUDA context is made)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [gpu.strip() for gpu in visible.split(",") if gpu.strip() and gpu.strip() != "-1"]
    listed = Path("/proc/driver/nvidia/gpus")
    if listed.is_dir():
        return [str(index) for index in range(len(list(listed.iterdir())))]
    if shutil.which("nvidia-smi"):
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
        return [str(i) for i, line in enumerate(out.stdout.splitlines()) if line.startswith("GPU")]
    return []


class OwnWorkers(WorkerGroup):
    """One command's own worker processes, from their start (they import while the command
    makes the data) to their end (``close``)."""

    kind = "own"

    def __init__(self, cfg: Recipe) -> None:
        super().__init__(cfg)
        self._held = contextlib.ExitStack()
        self._stop_relay: Any = None
        from trainforge.driver import background

        self._held.enter_context(background.training_here())  # a background start waits
        self.slots = self._held.enter_context(warm_pool.claimed_slots(cfg.scaling.num_workers))
        self.gpus: list[str] | None = None
        if cfg.scaling.use_gpu == "true":
            self.gpus = warm_pool.slot_gpus(self.slots, len(visible_gpus()))
        self.processes: list[subprocess.Popen[bytes]] = []
        self.connections: list[Connection] = []
        self.outputs: list[IO[bytes]] = []

    def start(self) -> None:
        from trainforge.driver import bytecode

        first = not self.processes and self._stop_relay is None
        if first:
            bytecode.warn_if_workers_compile_torch()
        imports = run_imports(self.cfg)  # at their start, while the command makes the data
        for index in range(self.cfg.scaling.num_workers):
            ours, theirs = socket.socketpair()
            output = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop
            with theirs:
                process = subprocess.Popen(
                    [sys.executable, "-m", "trainforge.worker.own", str(theirs.fileno())],
                    stdin=subprocess.DEVNULL, stdout=output, stderr=output,
                    pass_fds=(theirs.fileno(),),
                    start_new_session=True,  # a Ctrl-C is the command's: it stops them
                )  # fmt: skip
            connection = Connection(ours.detach())
            gpu = self.gpus[index] if self.gpus else None
            connection.send((sys.path, os.getpid(), gpu, imports))
            self.processes.append(process)
            self.connections.append(connection)
            self.outputs.append(output)
        if first:
            gpus = self.gpus or []
            where = f" on GPU{'s' * (len(gpus) > 1)} {','.join(gpus)}" if gpus else ""
            log.say(f"workers: starting {self.cfg.scaling.num_workers}{where}, processes of "
                    "this command")  # fmt: skip

    def prepare(self, payload: WorkerPayload) -> WorkerPayload:
        payload = payload.but(console_file=str(warm_pool.console_file(payload)),
                              gpus=tuple(self.gpus or ()), started=len(self.processes))  # fmt: skip
        output = None
        folder = storage.local_folder(payload.run_dir)
        if log.verbosity() <= 0 and folder is not None:  # -v: every worker line as it comes
            output = console.Console(folder / "worker-output.log")
        self._held.callback(lambda: output.close() if output is not None else None)
        self._stop_relay = console.relay_file(Path(str(payload.console_file)), output)
        self._held.callback(self._end_relay)  # their last lines, before the output closes
        return payload

    def run(self, payload: WorkerPayload) -> Finished | Failures:
        port = local_cluster.free_port()
        world_size = len(self.processes)
        ranks: dict[Any, int] = {}  # connection → rank (``wait`` returns the ready ones)
        for rank, connection in enumerate(self.connections):
            with contextlib.suppress(OSError):  # it died importing: its end of file tells
                connection.send(("run", payload, rank, world_size, port))
            ranks[connection] = rank
        results: dict[int, Any] = {}
        failures: Failures = {}
        while len(results) + len(failures) < world_size:
            waiting = [c for c in ranks if ranks[c] not in results and ranks[c] not in failures]
            ready = wait(waiting, timeout=OTHERS_WAIT_S if failures else None)
            if not ready:  # the others wait in a collective for a failed rank
                break
            for each in ready:
                rank = ranks[each]
                try:
                    kind, value = self.connections[rank].recv()
                except (EOFError, OSError):
                    kind, value = "failed", self._died(rank)
                (failures if kind == "failed" else results)[rank] = value
        if failures:
            return failures
        return Finished(results[0]["metrics"], results[0]["checkpoint"])

    def _died(self, rank: int) -> BaseException:
        """A worker process that ended without an answer (killed, crashed, failed importing):
        its end in words, and the last line it printed (a traceback's names the error)."""
        process, output = self.processes[rank], self.outputs[rank]
        code = process.wait()
        output.seek(0)
        tail = output.read().decode(errors="replace").strip().splitlines()[-1:]
        return died(rank, process.pid, how_it_ended(code) + "".join(f": {t}" for t in tail))

    def stop(self) -> None:
        """End every worker process (and what it started: DataLoader workers)."""
        for connection in self.connections:
            connection.close()  # an idle worker ends on it
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_WAIT_S
        for process in self.processes:
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for output in self.outputs:
            output.close()
        self.processes, self.connections, self.outputs = [], [], []

    def close(self) -> None:
        self.stop()
        self._held.close()

    def _end_relay(self) -> None:
        """Show what the workers wrote that is not shown yet, and relay no more."""
        if self._stop_relay is not None:
            self._stop_relay()
            self._stop_relay = None

    def after(self, exit_code: int) -> None:
        """A run was made, and not given up: more may follow, so the lasting cluster starts
        in the background, unless none is kept."""
        if exit_code != 130 and settings.keeps_cluster():
            from trainforge.driver import background

            background.start_cluster(self.cfg)
