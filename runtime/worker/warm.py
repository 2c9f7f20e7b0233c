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
import sys
import threading
import time
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any, TextIO

from trainforge import log
from trainforge.worker import environment
from trainforge.worker.payload import WorkerPayload
from trainforge.worker.process_group import Place

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
            os.environ.update(environment.gpu_worker_env(os.environ))
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
        the next command must not be served from that import (a time taken anew after each
        run would have served it). Left open: a module edited
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

    def run(self, payload: WorkerPayload, rank: int, world_size: int, port: int,
            driver_pid: int) -> dict[str, Any]:  # fmt: skip
        """One rank of one run; returns what rank 0 reported last with a checkpoint."""
        import torch

        from trainforge.checkpoint import RunFolderReporter
        from trainforge.distributed import WorkerContext
        from trainforge.worker import process_group
        from trainforge.worker.trainer import run

        self.claimed_by, self.running = driver_pid, True
        try:
            with lines_to(Path(str(payload.console_file)), rank), \
                    environment.applied(payload.env):  # fmt: skip
                device = torch.device("cpu")
                if self.gpu is not None:
                    device = torch.device("cuda", 0)  # the one GPU this process sees
                    torch.cuda.set_device(device)
                place = Place.on_one_machine(rank, world_size)
                process_group.join("gloo" if self.gpu is None else "nccl", place,
                                   ("127.0.0.1", port), payload.timeout_s, device)  # fmt: skip
                try:
                    if rank == 0:
                        say_started(payload, world_size)
                    ctx = WorkerContext(rank, rank, world_size, 0, device)
                    reporter = RunFolderReporter(Path(payload.run_dir), payload.keep_last, rank)
                    run(payload, ctx, reporter)
                    return reporter.result()
                finally:
                    process_group.leave()
        finally:
            self.running = False
            release_run_memory()  # the run's model and data, before the process waits
            if self.gpu is not None:
                import torch

                torch.cuda.empty_cache()  # the GPU's memory back to other processes
            self.note_imports()


def say_started(payload: WorkerPayload, world_size: int) -> None:
    """Rank 0's line once the group is up: how many of the workers were started for this
    command and how many were warm, on which GPUs."""
    started = payload.started
    how = {0: "warm", world_size: "started"}.get(
        started, f"ready ({started} started, {world_size - started} warm)"
    )
    gpus = payload.gpus
    where = f" on GPU{'s' if len(gpus) > 1 else ''} {','.join(gpus)}, nccl" if gpus else ""
    log.phase("workers", f"{world_size} {how}{where}, process group up", payload.requested_at)


class WarmSimulator(WarmWorker):
    """A warm simulator: a process of the lasting cluster's pool that runs the tasks of one
    command's data stage after another's (``driver/stage.py``), so a stage does not pay again
    for new processes and their imports (torch, SciPy, the user's simulator: ~3 s of a 2-core
    CPU before the first task; 7 s of a 16-core GPU host's stage). It is kept fresh as a warm
    worker is (``serve``): a simulator whose module changed on disk is replaced, never run from
    an old import."""

    LOOP = "trainforge.worker.task"

    def __init__(self, sys_path: list[str], driver_pid: int, idle_s: float) -> None:
        super().__init__(sys_path, driver_pid, idle_s, None, imports=())

    def run_task(self, function: Callable[..., Any], items: list[Any], args: tuple[Any, ...],
                 env: dict[str, str]) -> tuple[Any, str]:  # fmt: skip
        """One task of the stage (``worker/task.py``). Should the command die meanwhile, the
        process ends (``_watch``): its items are nobody's."""
        from trainforge.worker import task

        self.running = True
        try:
            return task.run(function, items, args, env)
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
def lines_to(path: Path, rank: int) -> Any:
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
