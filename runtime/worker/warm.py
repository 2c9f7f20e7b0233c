"""A warm worker: one process of the lasting local cluster's pool (``driver/warm_pool.py``) that
runs the training loop for one run after another, so a run does not pay again for a new process,
the imports of torch and the loop, and Ray Train's worker group.

Between runs it must be as good as a new process:
- it serves no command once a module it imported has changed on disk, nor a command whose
  Python path lacks the entry a module came from (``serve``): an edited model or simulator,
  or another folder's, is never run from an old import;
- each run sets its own threads, settings and seeds (as a new worker does), joins a new
  process group (gloo; NCCL on its GPU) and leaves it at the end;
- a GPU worker is bound to one GPU for life (``CUDA_VISIBLE_DEVICES``, set before torch is
  imported): its CUDA context, cuDNN's autotuned choices and compiled kernels serve every run,
  and between runs it gives back the memory its caching allocator held;
- it ends itself when the command it serves dies (a SIGKILLed driver cannot stop it), so a
  killed command never leaves a loop running.

A Ray actor's output reaches only the command that created it; a warm worker serves later
commands, so it writes its lines to a file in the run folder that the command relays
(``driver/console.py``, ``relay_file``).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import os
import shutil
import sys
import threading
import time
from collections.abc import Collection, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from trainforge import log, ray_compat
from trainforge.worker import settings

CHECK_S = 1.0
"""How often a warm worker checks that the command it serves is alive."""


class WarmWorker:
    """The actor class (``driver/warm_pool.py`` makes it a detached Ray actor)."""

    LOOP = "trainforge.worker.trainer"
    """What every process of this class imports (once): the loop."""

    def __init__(self, sys_path: list[str], driver_pid: int, idle_s: float,
                 gpu: str | None,
                 imports: Sequence[str] = ("torch._dynamo",)) -> None:  # fmt: skip
        """``imports``: what the runs will import beyond torch and the loop, imported now, not
        in a run. By default ``torch._dynamo`` (0.9 s of this CPU, 3.5-5.3 s of a GPU host),
        which DDP's constructor and ``torch.compile`` import: a warm worker may serve any run.
        A cold command's own worker is told what its one run needs instead: a lone rank that
        does not compile never imports dynamo (``optim.WithoutDynamo``), and the workload adds
        what its first step imports (``WorkloadSpec.worker_imports``)."""
        if gpu is not None:  # before torch's import: Ray may have hidden every GPU from us
            os.environ["CUDA_VISIBLE_DEVICES"] = gpu
            os.environ.update(settings.gpu_worker_env(os.environ))
        self.gpu = gpu
        _use_sys_path(sys_path)
        self.sys_path = list(sys_path)
        self.claimed_by, self.idle_s, self.last_used = driver_pid, idle_s, time.monotonic()
        self.running = False
        threading.Thread(target=self._watch, name="trainforge-watch", daemon=True).start()
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        import torch

        for module in (self.LOOP, *imports):
            importlib.import_module(module)
        if gpu is not None:
            torch.zeros(1, device="cuda")  # the CUDA context (a second or more), made once
        self.loaded = _module_files()
        release_run_memory()

    def serve(self, sys_path: list[str], cwd: str, driver_pid: int, idle_s: float,
              gpu: str | None) -> str | None:  # fmt: skip
        """Whether this process may serve a command whose Python path is ``sys_path``, on
        ``gpu`` (None: the CPU): None, and that path and the command's folder (``cwd``, where
        Ray starts a job's workers) are taken on, and the process is the command's
        (``driver_pid``) until it ends; else why not. A command started in another folder has
        another path: fine, unless a module came from an entry the new path lacks."""
        if gpu != self.gpu:
            return f"bound to {_device_name(self.gpu)}, this run wants {_device_name(gpu)}"
        removed = [entry for entry in self.sys_path if entry not in sys_path]
        removed_folders = {_folder(entry): entry for entry in removed}
        for name, (path, mtime) in self.loaded.items():
            if _mtime(path) != mtime:
                return f"module {name} changed on disk"
            source = removed_folders.get(_import_root(name, path) or "")
            if source is not None:
                return f"module {name} came from {source}, not on this command's Python path"
        for entry in removed:
            while entry in sys.path:
                sys.path.remove(entry)
        _use_sys_path(sys_path)
        self.sys_path = list(sys_path)
        with contextlib.suppress(OSError):  # a folder gone since: relative paths fail later
            os.chdir(cwd)
        self.claimed_by, self.idle_s, self.last_used = driver_pid, idle_s, time.monotonic()
        return None

    def note_imports(self) -> None:
        """Check the modules imported since the last look (by a run, a simulation task) at
        later commands too, with their modification times now. Those seen before keep the
        time they had: a module edited while a run used it was imported before the edit, and
        the next command must not be served from that import (until the forty-sixth session
        every time was taken anew after each run, and it was). Left open: a module edited
        during the very run that first imported it; marking every module modified since the
        run began would also retire a worker for each file a run generates and imports."""
        new = [name for name in sys.modules if name not in self.loaded]
        self.loaded |= _module_files(new)

    def info(self) -> dict[str, Any]:
        """What ``trainforge cluster status`` shows of this process (asked only between runs:
        an actor's calls wait for the run in progress)."""
        import psutil

        return {
            "pid": os.getpid(),
            "device": _device_name(self.gpu),
            "unused_s": round(time.monotonic() - self.last_used),
            "idle_limit_s": self.idle_s,
            "memory_mb": round(psutil.Process().memory_info().rss / 2**20),
        }

    def _watch(self) -> None:
        """A command that claimed this process keeps it for as long as that command lives.
        Should it die during a run (a SIGKILLed driver cannot stop its workers), the process
        ends: the loop may be inside a collective, nothing to wind down. Unused for
        ``idle_s``, it ends too: its memory back to the machine, the next command starts a
        new one."""
        while True:
            time.sleep(CHECK_S)
            if self.claimed_by and _alive(self.claimed_by):
                self.last_used = time.monotonic()
            elif self.running:
                os._exit(1)
            elif time.monotonic() - self.last_used > self.idle_s:
                os._exit(0)
            else:
                self.claimed_by = 0

    def track(self, call: str, args: tuple[Any, ...], env: dict[str, str],
              console_file: str) -> Any:  # fmt: skip
        """The command's MLflow calls (``tracking.driver.start_run``, ``finish_run``) in this
        process, where MLflow is imported and its store open after the first run."""
        from trainforge.tracking import driver as tracking

        with _lines_to(Path(console_file), 0), settings.applied(env):
            return getattr(tracking, call)(*args)

    def open_tracking(self, uri: str, env: dict[str, str]) -> None:
        """MLflow imported and the run's store opened ahead of the run (``warm_pool.prestart``):
        a new process's first MLflow call costs seconds (2 s on this project's CPU, 5-7 s on a
        4-core GPU host), which then overlap the data stage. A failure is left to the run's
        own MLflow call, which reports it."""
        from trainforge.tracking.client import open_store

        with settings.applied(env), contextlib.suppress(Exception):
            open_store(uri, ask_server=False)  # a slow server would hold this process's queue

    def run(self, payload: dict[str, Any], rank: int, world_size: int, port: int,
            driver_pid: int) -> dict[str, Any]:  # fmt: skip
        """One rank of one run; returns what rank 0 reported last with a checkpoint."""
        import torch
        import torch.distributed as dist

        from trainforge.distributed import WorkerContext
        from trainforge.worker.trainer import run

        self.claimed_by, self.running = driver_pid, True
        try:
            env = payload["env"] | rank_env(rank, world_size)
            with _lines_to(Path(payload["console_file"]), rank), settings.applied(env):
                timeout = payload["recipe"]["scaling"]["timeout_s"]
                store = dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0,
                                      timeout=_seconds(timeout))  # fmt: skip
                device = torch.device("cpu")
                if self.gpu is not None:
                    device = torch.device("cuda", 0)  # the one GPU this process sees
                    torch.cuda.set_device(device)
                # NCCL's communicator is made here (device_id) where there are ranks to talk
                # to; a lone rank makes no collective call (distributed.several_ranks), so its
                # group never makes one
                dist.init_process_group(
                    "gloo" if self.gpu is None else "nccl", store=store, rank=rank,
                    world_size=world_size, timeout=_seconds(timeout),
                    device_id=device if self.gpu is not None and world_size > 1 else None,
                )  # fmt: skip
                try:
                    if rank == 0:
                        started = payload.get("workers_started", 0)
                        how = {0: "warm", world_size: "started"}.get(
                            started, f"ready ({started} started, {world_size - started} warm)"
                        )
                        gpus = payload.get("gpus") or []
                        where = f" on GPU{'s' if len(gpus) > 1 else ''} {','.join(gpus)}, nccl"
                        log.phase("workers", f"{world_size} {how}{where if gpus else ''}, "
                                  "process group up", payload["workers_requested_at"])  # fmt: skip
                    ctx = WorkerContext(rank, rank, world_size, 0, device)
                    reporter = RunFolderReporter(
                        Path(payload["run_dir"]), payload["recipe"]["checkpoint"]["keep_last"], rank
                    )
                    model = run(payload, ctx, reporter)
                    result = reporter.result()
                    if model is not None:  # the command logs it to MLflow (tracking/relay.py)
                        result["model"] = model
                    return result
                finally:
                    dist.destroy_process_group()
        finally:
            self.running = False
            release_run_memory()  # the run's model and data, before the process waits
            if self.gpu is not None:
                import torch

                torch.cuda.empty_cache()  # the GPU's memory back to other processes
            self.note_imports()


class WarmSimulator(WarmWorker):
    """A warm simulator: a process of the lasting cluster's pool that simulates the chunks of one
    command's simulation stage after another's (``simulate.py``), so a stage does not pay again
    for new processes and their imports (torch, SciPy, the user's simulator: ~3 s of this
    project's CPU before the first chunk; 7 s of a 16-core GPU host's stage, bench/results,
    forty-sixth session). It is kept fresh as a warm worker is (``serve``):
    a simulator whose module changed on disk is replaced, never run from an old import."""

    LOOP = "trainforge.workloads.sbi.simulate"

    def __init__(self, sys_path: list[str], driver_pid: int, idle_s: float) -> None:
        super().__init__(sys_path, driver_pid, idle_s, None, imports=())

    def simulate(self, cfg: Any, seed: int, chunks: list[tuple[int, int]], device: str,
                 env: dict[str, str]) -> dict[str, Any]:  # fmt: skip
        """One task of the stage: ``simulate.simulate_chunks`` in this process, with the
        command's environment ``env``. Should the command die meanwhile, the process ends
        (``_watch``): its chunks are nobody's."""
        from trainforge.workloads.sbi import simulate

        self.running = True
        try:
            return simulate.simulate_chunks(cfg, seed, chunks, device, env)
        finally:
            self.running = False
            self.note_imports()  # the user's simulator, at the first task


def release_run_memory() -> None:
    """Collect the last run's garbage, then freeze what survived (imported modules, caches) out
    of later collections. A full collection walks every tracked object: in a process that has
    imported torch, MLflow and matplotlib that took 0.4-0.7 s of this project's CPU at each
    run's end, on the command's path to its summary. Frozen, the walk covers only what the next
    run makes. Frozen objects are still freed when their last reference goes; a frozen cycle
    that later becomes garbage stays, which is why the collection comes first, when the run's
    objects are unreachable."""
    gc.collect()
    gc.freeze()


def rank_env(rank: int, world_size: int) -> dict[str, str]:
    """The variables Ray Train (and torchrun) give each worker, which code in the loop may read
    (the SBI workload sizes its host memory by LOCAL_WORLD_SIZE): one machine, so the local
    rank is the rank."""
    return {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size), "NODE_RANK": "0"}  # fmt: skip


class RunFolderReporter:
    """Checkpoints go into the run folder as Ray Train persists them (``checkpoint_<time>``,
    complete or not at all), the newest ``keep_last`` kept; like ``ray.train.report``, every
    report is a barrier of all ranks. The loop finds the latest checkpoint in the run folder
    itself (``checkpoint.latest``), so nothing is registered elsewhere."""

    def __init__(self, run_dir: Path, keep_last: int, rank: int) -> None:
        self.run_dir, self.keep_last, self.rank = run_dir, keep_last, rank
        self.last: dict[str, Any] = {}
        self.checkpoint: Path | None = None
        if rank == 0:
            run_dir.mkdir(parents=True, exist_ok=True)
            for partial in run_dir.glob(".checkpoint_*.partial"):  # from a killed run
                shutil.rmtree(partial, ignore_errors=True)

    def report(self, metrics: dict[str, float], folder: Path | None) -> None:
        import torch.distributed as dist

        from trainforge import distributed

        if folder is not None and self.rank == 0:
            name = "checkpoint_" + datetime.now().strftime("%Y-%m-%d_%H-%M-%S.%f")
            partial = self.run_dir / f".{name}.partial"
            shutil.copytree(folder, partial)
            os.replace(partial, self.run_dir / name)  # complete, or not there at all
            self.checkpoint = self.run_dir / name
            self.last = {**metrics}
            self._prune()
        elif self.checkpoint is None:
            self.last = {**metrics}
        if distributed.several_ranks():
            dist.barrier()

    def registered(self) -> dict[str, Any] | None:
        return None  # the run folder is the registry

    def result(self) -> dict[str, Any]:
        return {"metrics": self.last, "checkpoint": str(self.checkpoint or "") or None}

    def _prune(self) -> None:
        # Timestamp names sort by time; Ray Train's folders from earlier runs share the format.
        folders = sorted(f for f in self.run_dir.glob(ray_compat.CHECKPOINT_DIR_GLOB) if f.is_dir())
        for old in folders[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def _device_name(gpu: str | None) -> str:
    return "the CPU" if gpu is None else f"GPU {gpu}"


def _use_sys_path(entries: list[str]) -> None:
    for entry in reversed(entries):
        if entry and entry not in sys.path:
            sys.path.insert(0, entry)


def _folder(entry: str) -> str:
    return os.path.normpath(os.path.abspath(entry))


def _import_root(name: str, path: str) -> str | None:
    """The Python path entry that module ``name`` was found in: its file less the dotted name
    (``pkg/mod.py``, ``pkg/mod/__init__.py``, ``pkg/mod.cpython-311-x86_64-linux-gnu.so``).
    Not any folder that holds the file: a virtualenv inside the user's project puts every
    installed module (Ray's own ``__main__`` of every worker too) inside the project's folder,
    and a command without that folder on its path retired every warm worker of one with it.
    None where the file does not follow the name (a worker's ``__main__``, a package that an
    editable install maps from a folder of another name): no entry gave it, none can take it
    away."""
    location = Path(_folder(path))
    if location.name.split(".", 1)[0] == "__init__":
        location = location.parent
    for part in reversed(name.split(".")):
        if location.name.split(".", 1)[0] != part:
            return None
        location = location.parent
    return str(location)


def _module_files(names: Collection[str] | None = None) -> dict[str, tuple[str, float | None]]:
    """Every imported module's file (or those of ``names``) and its modification time now."""
    files = {}
    for name in list(sys.modules) if names is None else names:
        path = getattr(sys.modules.get(name), "__file__", None)
        if isinstance(path, str) and os.path.isabs(path):  # torch.ops says "_ops.py"
            files[name] = (path, _mtime(path))
    return files


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _seconds(seconds: float) -> Any:
    from datetime import timedelta

    return timedelta(seconds=seconds)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's: alive
        return True
    return True


class _LineWriter(io.TextIOBase):
    """A text stream that appends each complete line to the run's console file, tagged with
    this process, its rank and whether it was stderr."""

    def __init__(self, sink: TextIO, rank: int, is_err: bool, lock: threading.Lock) -> None:
        self.sink, self.tag, self.lock = sink, f"{os.getpid()}\t{rank}\t{int(is_err)}\t", lock
        self.pending = ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        if lines:
            with self.lock:
                self.sink.write("".join(f"{self.tag}{line}\n" for line in lines))
                self.sink.flush()
        return len(text)

    def flush(self) -> None:
        pass  # whole lines only: a partial line waits for its end


@contextlib.contextmanager
def _lines_to(path: Path, rank: int) -> Any:
    """Send this process's Python output (stdout, stderr: trainforge's lines, warnings) to
    ``path`` while the run lasts."""
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = threading.Lock()
    with open(path, "a", buffering=1) as sink:
        out, err = _LineWriter(sink, rank, False, lock), _LineWriter(sink, rank, True, lock)
        saved = sys.stdout, sys.stderr
        sys.stdout, sys.stderr = out, err
        try:
            yield
        finally:
            for stream in (out, err):
                if stream.pending:
                    stream.write("\n")
            sys.stdout, sys.stderr = saved
