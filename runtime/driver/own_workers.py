"""A cold local command's workers: processes of its own (``worker/own.py``), started at once,
while no local cluster runs; the lasting cluster starts in the background after the run, for
later commands. With TRAINFORGE_KEEP_CLUSTER=0 (no cluster kept) a command that needs none
trains so too, and starts nothing afterwards.

Why: with no Ray running, a command waited for the lasting cluster's start (`ray start`, 7.4 s on
this project's 2-core CPU, 7.7 s on a 16-core H100 host) and then for its warm workers' start
(their imports; 13 s on that host) before the first step: 15.8 s on the CPU, 25.3 s on one H100
(bench/results, issue 12). Training on one machine needs no cluster: the command starts its
workers itself and they import while it makes the data; it makes the MLflow run beside them
and sends what rank 0 writes (``tracking/relay.py``: the workers' run never waits for MLflow).

A worker is the warm pool's worker class (``worker/warm.py``) in a plain process: the same loop,
process group (gloo; NCCL on its GPU) over a TCP store on loopback, checkpoints in the run folder,
lines relayed from the run folder's file. What the warm pool does for a run, done here too:
restarts within ``run.max_failures`` from the latest checkpoint (``warm_pool.with_restarts``), a
Ctrl-C stops the workers, their errors reach the command rank by rank (``WorkersFailed``). GPU
workers take the warm pool's slots, so two commands take different GPUs. A worker ends when its
command ends, even a SIGKILLed one (it checks that the command lives).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pickle
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

from trainforge import log
from trainforge.config import Recipe
from trainforge.driver import local_cluster, warm_pool

ENV = "TRAINFORGE_COLD_WORKERS"
"""``ray``: a command with no local cluster running starts it and runs on its warm workers, as
one does when it runs (``own``, the default: the command's own processes)."""
STOP_WAIT_S = 5.0  # a worker asked to stop (SIGTERM) gets this long before SIGKILL


def unavailable(cfg: Recipe, storage_path: str) -> str | None:
    """Why this command cannot run on its own processes (None: it can). Checked before Ray:
    only a local command with no cluster to use qualifies. With TRAINFORGE_KEEP_CLUSTER=0 a
    command that needs no cluster qualifies too (and starts none afterwards): a private Ray
    and Ray Train's workers cost the 2-epoch digits command 38 s on this project's 2-core CPU,
    its own processes 9 s, and neither leaves anything running."""
    if os.environ.get(ENV, "own").strip().lower() == "ray":
        return f"{ENV}=ray"
    if os.environ.get("RAY_ADDRESS"):
        return "RAY_ADDRESS names a cluster"
    if _connected_to_ray():
        return "this process is connected to Ray"
    if cfg.scaling.use_gpu != "false" and cfg.scaling.resources_per_worker.get("GPU", 1) != 1:
        return "workers of other than one GPU each"
    if _needs_cluster(cfg):
        return "its data stage runs on the cluster"
    # its switch (TRAINFORGE_WARM_WORKERS=0) and remote storage rule these out too
    why_not_warm = warm_pool.unavailable(cfg, storage_path, on_lasting_cluster=True)
    if why_not_warm is not None:
        return why_not_warm
    if local_cluster.keep_cluster() and local_cluster.running() is not None:
        return "the local cluster runs"
    return None


CRASHES = {signal.SIGSEGV, signal.SIGBUS, signal.SIGILL, signal.SIGFPE, signal.SIGABRT}


def how_it_ended(code: int) -> str:
    """A worker process's end, from its return code, in the words a user acts on: a SIGKILL
    nobody here sent is most often the kernel's out-of-memory killer."""
    if code >= 0:
        return f"ended with exit code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"was killed by signal {-code}"
    if -code == signal.SIGKILL:
        return f"was killed by SIGKILL ({warm_pool.OUT_OF_MEMORY}; or a kill -9)"
    if -code in CRASHES:
        return f"crashed ({name}: a fault in native code, or an abort)"
    return f"was stopped by {name}"


def phase_line() -> str:
    """The command's first line where its workers are its own processes."""
    if local_cluster.keep_cluster():
        return "ray: no local cluster runs; this run's workers are processes of this command"
    return (f"ray: none for this command ({local_cluster.KEEP_ENV}=0: nothing outlives it); "
            "this run's workers are processes of this command")  # fmt: skip


def _connected_to_ray() -> bool:
    """Has this process joined a Ray cluster already (``ray.init`` in a notebook or a script
    that calls ``launch.train``)? Its run goes there. Ray is not imported to find out."""
    ray = sys.modules.get("ray")
    return ray is not None and bool(ray.is_initialized())


def _needs_cluster(cfg: Recipe) -> bool:
    """Does the workload's data stage spread work over Ray (SBI simulations too big to be made
    by the command's own process)?"""
    if cfg.workload.kind != "sbi":
        return False
    from trainforge.workloads.sbi import simulate

    section: Any = cfg.workload
    return section.simulation.path is None and not simulate.simulates_here(section)


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


class OwnRun:
    """One command's own worker processes, from their start (``__init__``: they import while
    the command makes the data) to their end (``close``); ``run`` runs the loop in them, with
    restarts."""

    def __init__(self, cfg: Recipe) -> None:
        self.cfg = cfg
        self._held = contextlib.ExitStack()
        self._stop_relay: Any = None
        count = cfg.scaling.num_workers
        self.slots = self._held.enter_context(warm_pool.claimed_slots(count))
        self.gpus: list[str] | None = None
        if cfg.scaling.use_gpu == "true":
            self.gpus = warm_pool.slot_gpus(self.slots, len(visible_gpus()))
        self.processes: list[subprocess.Popen[bytes]] = []
        self.connections: list[Connection] = []
        self.outputs: list[IO[bytes]] = []
        self._start()
        where = f" on GPU{'s' * (count > 1)} {','.join(self.gpus)}" if self.gpus else ""
        log.say(f"workers: starting {count}{where}, processes of this command")

    def _start(self) -> None:
        imports = self._imports()
        for index in range(self.cfg.scaling.num_workers):
            ours, theirs = socket.socketpair()
            output = tempfile.TemporaryFile()  # noqa: SIM115 - closed in _stop
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

    def _imports(self) -> tuple[str, ...]:
        """What the run imports beyond torch and the loop, for the workers to import at their
        start, while the command makes the data (neutral when the data is ready first: the
        imports come before the first step either way): ``torch._dynamo`` where the run needs
        it (DDP's constructor, ``torch.compile``; a lone rank that does not compile never
        imports it: ``optim.WithoutDynamo``), and what the workload's first step imports."""
        from trainforge.workloads import spec_for

        needs_dynamo = self.cfg.scaling.num_workers > 1 or self.cfg.precision.compile
        dynamo = ("torch._dynamo",) if needs_dynamo else ()
        return dynamo + spec_for(self.cfg.workload.kind).worker_imports

    def attach(self, payload: dict[str, Any], output: Any) -> None:
        """The run's payload: the workers' lines go to its console file, which this command
        shows (on ``output``) until ``close``."""
        from trainforge.driver import console

        self.payload = payload
        payload["console_file"] = str(warm_pool.console_file(payload))
        payload["gpus"] = self.gpus
        payload["workers_started"] = self.cfg.scaling.num_workers  # "N started"
        self._stop_relay = console.relay_file(Path(payload["console_file"]), output)

    def run(self) -> warm_pool.Finished:
        """The loop in the workers until it ends, restarts within ``run.max_failures``; raises
        ``WorkersFailed``, or KeyboardInterrupt after stopping the workers and showing their last
        lines: what the command says next (interrupted, failed) comes after them."""
        try:
            finished = warm_pool.with_restarts(
                self.cfg.run.max_failures, self._run_once, self._stop, self._start, self.payload
            )
        except BaseException:
            self._stop()
            self._end_relay()
            raise
        # their last lines (an SBI run's evaluation) before the command's closing table: the
        # relay reads their file every 0.1 s, and the table once followed them
        self._end_relay()
        return finished

    def _run_once(self) -> warm_pool.Finished | dict[int, BaseException]:
        port = local_cluster.free_port()
        world_size = len(self.processes)
        ranks: dict[Any, int] = {}  # connection → rank (``wait`` returns the ready ones)
        for rank, connection in enumerate(self.connections):
            with contextlib.suppress(OSError):  # it died importing: its end of file tells
                connection.send(("run", self.payload, rank, world_size, port))
            ranks[connection] = rank
        results: dict[int, Any] = {}
        while len(results) < world_size:
            for ready in wait([c for c in ranks if ranks[c] not in results]):
                rank = ranks[ready]
                try:
                    kind, value = self.connections[rank].recv()
                except (EOFError, OSError):
                    kind, value = "failed", self._died(rank)
                if kind == "failed":
                    return {rank: value}  # the others may wait in a collective for it
                results[rank] = value
        main = results[0]
        return warm_pool.Finished(main["metrics"], main["checkpoint"], main.get("model"))

    def _died(self, rank: int) -> RuntimeError:
        """A worker process that ended without an answer (killed, crashed, failed importing):
        an error with the last lines it printed."""
        process, output = self.processes[rank], self.outputs[rank]
        code = process.wait()
        output.seek(0)
        tail = output.read().decode(errors="replace").strip().splitlines()[-20:]
        how = how_it_ended(code)
        last = f": {tail[-1]}" if tail else ""  # a traceback's last line names the error
        return RuntimeError(f"worker process {process.pid} (rank {rank}) {how}{last}" +
                            ("\n" + "\n".join(tail) if tail else ""))  # fmt: skip

    def _stop(self) -> None:
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
        """Stop the workers, show their last lines and give back their slots (again: nothing
        happens)."""
        self._stop()
        self._end_relay()
        self._held.close()

    def _end_relay(self) -> None:
        """Show what the workers wrote that is not shown yet, and relay no more."""
        if self._stop_relay is not None:
            self._stop_relay()
            self._stop_relay = None


def start_cluster_in_background(cfg: Recipe) -> None:
    """Start the lasting local cluster and the run's warm workers (``warm_pool.prestart``) for
    later commands, in a detached process (``main``), and say so; this command does not wait.
    The process holds ``background.lock`` until it is done (``wait_for_background``). Where
    another command's background start still runs, this one starts nothing: its cluster serves
    both, and this command does not wait for it to end. Where a cluster came up while this
    command ran, the process only readies this recipe's warm workers there."""
    local_cluster.folder().mkdir(parents=True, exist_ok=True)
    with (
        open(local_cluster.background_lock_path(), "a") as lock,
        open(local_cluster.background_log_path(), "ab") as out,
    ):
        try:  # taken here, so no one finds it free before the start
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.say("ray: the local cluster is being started in the background by another "
                    "command; later commands use it")  # fmt: skip
            return
        started_meanwhile = local_cluster.running()
        lock.truncate(0)  # the last start's pid
        process = subprocess.Popen(
            [sys.executable, "-m", __name__, str(lock.fileno())],
            stdin=subprocess.PIPE, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True, pass_fds=(lock.fileno(),),
        )  # fmt: skip
        lock.write(f"{process.pid}\n")  # whom `trainforge cluster stop` asks to end
        lock.flush()
        assert process.stdin is not None
        with process.stdin:
            process.stdin.write(pickle.dumps((cfg, sys.path)))
    log.say(background_start_line(cfg.scaling.num_workers, started_meanwhile))


def background_start_line(num_workers: int, running: local_cluster.ClusterState | None) -> str:
    """What a command says of the background start it made: ``running`` is the lasting cluster
    where one came up while the command ran (``trainforge cluster start``, another command's
    background start), which only gets this recipe's warm workers."""
    workers = log.counted(num_workers, "warm worker", "warm workers")
    if running is not None:
        return (f"ray: the local cluster at {running.gcs_address} came up while this command "
                f"ran; readying {workers} there in the background for later commands")  # fmt: skip
    idle_min = local_cluster.idle_stop_s() / 60
    return (f"ray: starting the local cluster and {workers} in the background; later commands "
            f"use them, the cluster stops after {idle_min:.0f} min unused or on `trainforge "
            "cluster stop`")  # fmt: skip


def wait_for_background(timeout_s: float) -> bool:
    """Wait until no background start (``start_cluster_in_background``) runs; False on
    timeout."""
    deadline = time.monotonic() + timeout_s
    while local_cluster.background_start_running():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def stop_background(timeout_s: float = local_cluster.START_TIMEOUT_S + 30) -> None:
    """End a background start under way (``trainforge cluster stop`` does, before it stops the
    cluster, and ``cluster start --num-cpus``, before it starts its own): its process is asked
    with SIGTERM and waited for; a cluster start it began is let finish first (``StopAsked``),
    so that the cluster stopped after this is never one that comes up later."""
    if not local_cluster.background_start_running():
        return  # the lock's pid is an ended process's: never signalled
    deadline = time.monotonic() + 2  # its pid is written just after the process starts
    while (pid := _background_pid()) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    if not wait_for_background(timeout_s) and pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        wait_for_background(STOP_WAIT_S)


def _background_pid() -> int | None:
    try:
        return int(local_cluster.background_lock_path().read_text())
    except (OSError, ValueError):
        return None


class StopAsked(KeyboardInterrupt):
    """SIGTERM to a background start (``stop_background``): raised in its main thread as a
    Ctrl-C is, so that what it started on the cluster stops the way a command's run does."""


class _StopOnTerm:
    """SIGTERM raises ``StopAsked``, except while the cluster starts: then it is raised once
    the start is over (``start_done``), so that the cluster is up for its stop and not left to
    come up after it (its supervisor is a process apart, which goes on starting Ray)."""

    def __init__(self) -> None:
        self.asked, self.starting = False, True
        signal.signal(signal.SIGTERM, self._on_term)

    def _on_term(self, signum: int, frame: object) -> None:
        self.asked = True
        if not self.starting:
            raise StopAsked()

    def start_done(self) -> None:
        self.starting = False
        if self.asked:
            raise StopAsked()


def main(lock_fd: int) -> int:
    """The background start: the lasting cluster (``cluster.connect`` starts it, or joins one
    started meanwhile), then the warm workers a command of this recipe would take, and their
    first run, a rehearsal of this recipe (``rehearsal.py``), so the next command finds them
    as warm as workers that have run once. `trainforge cluster stop` ends it (SIGTERM)."""
    stop = _StopOnTerm()
    cfg, sys_path = pickle.load(sys.stdin.buffer)
    sys.path[:] = sys_path  # the command's: the warm workers take it on
    workers = log.counted(cfg.scaling.num_workers, "warm worker", "warm workers")
    log.say(f"background start (pid {os.getpid()}): the local cluster and {workers} for later "
            "commands")  # fmt: skip
    try:
        from trainforge.driver import rehearsal
        from trainforge.driver.cluster import connect

        connect()
        stop.start_done()
        started = warm_pool.prestart(cfg)
        code = rehearsal.rehearse(cfg, started)  # a stop there ends the rehearsal's run
        if code is not None and not stop.asked:
            log.say(f"rehearsal {'done' if code == 0 else f'failed (exit {code})'}")
    except KeyboardInterrupt:  # StopAsked, or Ray's own for it where it waited in ray.get
        if not stop.asked:
            raise
    if stop.asked:
        log.say("background start ended by `trainforge cluster stop` (or `start --num-cpus`)")
    os.close(lock_fd)
    return 0


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
