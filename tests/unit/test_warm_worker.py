"""A warm worker's own parts, in this process (``worker/warm.py``, ``driver/warm_pool.py``):
when it must not serve a command, where its checkpoints go, how its lines reach the console,
and which runs use warm workers at all. The whole path through the lasting cluster is in
tests/integration/test_local_cluster.py."""

from __future__ import annotations

import errno
import functools
import gc
import io
import os
import shutil
import sys
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
from torch import nn

from trainforge import checkpoint, log, settings
from trainforge.checkpoint import RunFolderReporter
from trainforge.driver import console, warm_pool
from trainforge.driver.console import Console
from trainforge.driver.workers.base import from_ray
from trainforge.worker import warm
from trainforge.worker.warm import WarmWorker


@pytest.fixture
def process_group(tmp_path: Path) -> Iterator[None]:
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)  # fmt: skip
    yield
    dist.destroy_process_group()


@pytest.fixture
def collector_unfrozen() -> Iterator[None]:
    """A WarmWorker built in the test process freezes it (``warm.release_run_memory``); the
    process goes on collecting everything afterwards, as it did before."""
    yield
    gc.unfreeze()


def test_an_edited_module_or_one_off_the_new_python_path_retires_a_warm_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, collector_unfrozen: None
) -> None:
    user_code = tmp_path / "project"
    user_code.mkdir()
    module = user_code / "user_model_for_warm_test.py"
    module.write_text("WIDTH = 1\n")
    monkeypatch.syspath_prepend(str(user_code))  # restored after the test
    import user_model_for_warm_test  # noqa: F401 - a module the user's recipe imported

    path = [entry for entry in sys.path if entry]
    worker = WarmWorker(path, os.getpid(), idle_s=600, gpu=None)
    this_command = (os.getcwd(), os.getpid(), 600, None)  # its folder, process, idle limit, CPU
    assert worker.serve(path, *this_command) is None  # nothing changed: it serves the next command
    on_a_gpu = (*this_command[:3], "1")
    assert worker.serve(path, *on_a_gpu) == "bound to the CPU, this run wants GPU 1"

    elsewhere = str(tmp_path / "other-folder")  # a command started in another folder
    assert worker.serve([elsewhere, *path], *this_command) is None
    assert sys.path[0] == elsewhere  # its path, taken on

    without = [entry for entry in path if entry != str(user_code)]
    assert worker.serve(without, *this_command) == (
        f"module user_model_for_warm_test came from {user_code}, not on this command's Python path"
    )
    module.write_text("WIDTH = 2\n")
    later = time.time() + 5
    os.utime(module, (later, later))
    assert worker.serve(path, *this_command) == "module user_model_for_warm_test changed on disk"


def test_a_module_from_a_path_entry_inside_a_removed_one_keeps_the_warm_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, collector_unfrozen: None
) -> None:
    """A virtualenv inside the user's project: a command with the project on its path (a
    simulator named from there) and the next one without it. Installed modules lie inside the
    project's folder but came from site-packages, which both commands have: the worker serves.
    A module that the project's entry itself gave still retires it, a package's too."""
    project = tmp_path / "project"
    site = project / ".venv" / "lib" / "site-packages"
    (site / "installed_pkg_for_warm_test").mkdir(parents=True)
    (site / "installed_pkg_for_warm_test" / "__init__.py").write_text("")
    (site / "installed_pkg_for_warm_test" / "core.py").write_text("A = 1\n")
    (project / "sims_for_warm_test").mkdir()
    (project / "sims_for_warm_test" / "__init__.py").write_text("")
    (project / "sims_for_warm_test" / "sir.py").write_text("B = 1\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(project))
    import installed_pkg_for_warm_test.core  # noqa: F401 - an installed module a run imported

    path = [entry for entry in sys.path if entry]
    worker = WarmWorker(path, os.getpid(), idle_s=600, gpu=None)
    this_command = (os.getcwd(), os.getpid(), 600, None)
    without_project = [entry for entry in path if entry != str(project)]
    assert worker.serve(without_project, *this_command) is None

    assert worker.serve(path, *this_command) is None  # the project's command again
    import sims_for_warm_test.sir  # noqa: F401 - the simulator, from the project's entry

    worker.note_imports()
    assert worker.serve(without_project, *this_command) == (
        f"module sims_for_warm_test came from {project}, not on this command's Python path"
    )


def test_a_module_edited_while_a_run_used_it_retires_the_warm_worker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, collector_unfrozen: None
) -> None:
    """A run imports the user's module, the user edits it while the run trains, the run ends:
    the next command must get a new process, not the import from before the edit."""
    user_code = tmp_path / "project"
    user_code.mkdir()
    module = user_code / "user_simulator_for_warm_test.py"
    module.write_text("RATE = 1\n")
    monkeypatch.syspath_prepend(str(user_code))
    path = [entry for entry in sys.path if entry]
    worker = WarmWorker(path, os.getpid(), idle_s=600, gpu=None)
    this_command = (os.getcwd(), os.getpid(), 600, None)

    import user_simulator_for_warm_test  # noqa: F401 - what the run imports

    worker.note_imports()  # a first run ends: its import is checked from now on
    assert worker.serve(path, *this_command) is None
    module.write_text("RATE = 2\n")  # edited during the next run
    later = time.time() + 5
    os.utime(module, (later, later))
    worker.note_imports()  # that run ends
    assert worker.serve(path, *this_command) == (
        "module user_simulator_for_warm_test changed on disk"
    )


def snapshot(folder: Path, step: int) -> Path:
    """A real checkpoint folder (weights, manifest) at ``step``."""
    model = nn.Linear(2, 1)
    state = {"model": model.state_dict(), "global_step": step, "epoch": step}
    folder.mkdir(parents=True)
    checkpoint.save(folder, state, "recipe: x\n")
    return folder


def test_checkpoints_land_whole_in_the_run_folder_and_the_newest_are_kept(
    tmp_path: Path, process_group: None
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / ".checkpoint_2026-01-01_00-00-00.000000.partial").mkdir()  # a killed run's copy
    reporter = RunFolderReporter(run_dir, keep_last=2, rank=0)
    assert not list(run_dir.glob(".checkpoint_*"))

    for step in (10, 20, 30):
        reporter.report({"val/loss": 1 / step}, snapshot(tmp_path / f"saved{step}", step))
    reporter.report({"epoch": 4}, None)  # a report without a checkpoint after the last one

    kept = sorted(run_dir.glob("checkpoint_*"))
    assert len(kept) == 2
    assert [checkpoint.load(folder)["global_step"] for folder in kept] == [20, 30]
    result = reporter.result()
    assert result == {"metrics": {"val/loss": 1 / 30}, "checkpoint": str(kept[-1])}
    found = checkpoint.latest(reporter, str(run_dir))  # where a restarted loop resumes
    assert found.state is not None and found.state["global_step"] == 30
    assert not list(run_dir.glob(".checkpoint_*"))  # no partial copy left


def test_a_copy_into_the_run_folder_cut_by_a_full_disk_leaves_nothing_of_itself(
    tmp_path: Path, process_group: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The disk fills up while a checkpoint is copied into the run folder: the error goes on to
    the loop (which says it in one line), and no partial copy stays on the full disk."""
    run_dir = tmp_path / "run"
    reporter = RunFolderReporter(run_dir, keep_last=2, rank=0)
    saved = snapshot(tmp_path / "saved", 10)
    copied: list[str] = []

    def copy_until_full(source: str, target: str, **kwargs: object) -> str:
        if copied:
            raise OSError(errno.ENOSPC, "No space left on device", target)
        copied.append(target)
        return shutil.copy2(source, target)

    monkeypatch.setattr(checkpoint.shutil, "copytree", functools.partial(
        shutil.copytree, copy_function=copy_until_full))  # fmt: skip
    with pytest.raises(OSError, match="No space left"):
        reporter.report({"val/loss": 0.1}, saved)
    assert copied and list(run_dir.iterdir()) == []


def test_a_warm_workers_lines_reach_the_console_as_relayed_lines_do(tmp_path: Path) -> None:
    log.set_verbosity(0)
    lines_file = tmp_path / ".worker-lines-abc"
    out = io.StringIO()
    shown = Console(tmp_path / "worker-output.log", out)
    stop = console.relay_file(lines_file, shown)
    with warm.lines_to(lines_file, rank=1):
        log.say("epoch 1/2 done: val/loss 0.5")
        print("an internal line the user does not need")
        sys.stderr.write("model.py:3: UserWarning: careful\n")
        print("half a line", end="")  # completed when the run ends
    stop()
    shown.close()

    assert out.getvalue().splitlines() == [
        "[trainforge] epoch 1/2 done: val/loss 0.5",
        "model.py:3: UserWarning: careful",
    ]
    kept = (tmp_path / "worker-output.log").read_text().splitlines()
    assert (
        kept[1]
        == f"(TrainforgeWorker rank=1 {os.getpid()}) an internal line the user does not need"
    )
    assert kept[-1].endswith(") half a line")
    assert not lines_file.exists()  # removed once relayed


def recipe(use_gpu: str = "false", **resources: float) -> SimpleNamespace:
    return SimpleNamespace(scaling=SimpleNamespace(use_gpu=use_gpu, resources_per_worker=resources))


def test_which_runs_use_warm_workers(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    workers = settings.WORKERS.name
    monkeypatch.delenv(workers, raising=False)
    local = str(tmp_path / "runs")
    assert warm_pool.unavailable(recipe(), local, on_lasting_cluster=True) is None  # type: ignore[arg-type]
    assert warm_pool.unavailable(recipe(), local, False) == "not on the lasting local cluster"  # type: ignore[arg-type]
    assert warm_pool.unavailable(recipe("true"), local, True) is None  # type: ignore[arg-type]
    assert warm_pool.unavailable(recipe("true", GPU=1), local, True) is None  # type: ignore[arg-type]
    assert warm_pool.unavailable(recipe("true", GPU=2), local, True) == (  # type: ignore[arg-type]
        "workers of other than one GPU each"
    )
    assert warm_pool.unavailable(recipe(), "s3://bucket/runs", True) == "remote storage"  # type: ignore[arg-type]
    assert warm_pool.simulators_unavailable(on_lasting_cluster=True) is None
    assert warm_pool.simulators_unavailable(False) == "not on the lasting local cluster"
    monkeypatch.setenv(workers, "warm")
    assert warm_pool.unavailable(recipe(), local, True) is None  # type: ignore[arg-type]
    monkeypatch.setenv(workers, "ray-train")  # Ray Train's worker group on the lasting cluster
    assert warm_pool.unavailable(recipe(), local, True) == f"{workers}=ray-train"  # type: ignore[arg-type]
    assert warm_pool.simulators_unavailable(True) == f"{workers}=ray-train"


@pytest.mark.ray
def test_a_warm_worker_whose_process_was_killed_is_said_in_words(
    ray_cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ray says only "The actor died unexpectedly before finishing this task." of a warm
    worker SIGKILLed mid-run (the OOM killer's signal): the run's line names the process, the
    rank and the likely causes, as for a command's own worker. Errors of the run pass as
    they are."""
    import signal

    ray = ray_cluster

    @ray.remote(num_cpus=0)
    class Worker:
        def pid(self) -> int:
            return os.getpid()

        def run(self) -> None:
            time.sleep(120)

    worker = Worker.remote()  # type: ignore[attr-defined]
    pid = ray.get(worker.pid.remote())
    running = worker.run.remote()
    os.kill(pid, signal.SIGKILL)
    with pytest.raises(ray.exceptions.ActorDiedError) as died:
        ray.get(running, timeout=60)
    assert str(from_ray(died.value, 1)) == (
        f"worker process {pid} (rank 1) ended unexpectedly (out of memory: the kernel's OOM "
        "killer; a kill -9; or a crash in native code)"
    )
    error = ValueError("the run's own")
    assert from_ray(error, 0) is error
    # Ray's raylet says the worker died on this process's console a moment later: read here,
    # else a later test of this process finds it in its own captured output
    seen, deadline = "", time.monotonic() + 15
    while "A worker died" not in seen and time.monotonic() < deadline:
        captured = capsys.readouterr()
        seen += captured.out + captured.err
        time.sleep(0.2)


def test_slot_n_takes_the_nth_gpu_the_command_sees(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 5")
    assert warm_pool.slot_gpus([0, 1]) == ["3", "5"]
    assert warm_pool.slot_gpus([1, 2]) == ["5", "3"]  # more slots than GPUs: they share


def test_a_command_takes_free_slots_where_warm_workers_live_on_its_gpus(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Slots are claimed lowest first, but a free slot with a living warm worker (a background
    start put one in slot 4 while another command held 0-3) replaces one without, where both
    have the same GPU (slot n: GPU n mod 4 here); a slot another command holds is never taken."""
    monkeypatch.setenv(settings.HOME.name, str(tmp_path / "home"))
    with warm_pool.claimed_slots(1, living={4}, gpus=4) as slots:
        assert slots == [4]  # slot 4's worker is on GPU 0, as slot 0's would be
    with warm_pool.claimed_slots(2, living={4, 6}, gpus=4) as slots:
        assert slots == [4, 1]  # slot 6 is GPU 2: not the second worker's GPU 1
    with warm_pool.claimed_slots(2, living={0, 9}, gpus=0) as slots:
        assert slots == [0, 9]  # CPU workers: any living one
    with (
        warm_pool.claimed_slots(1, living={4}, gpus=4) as mine,
        warm_pool.claimed_slots(1, living={4}, gpus=4) as theirs,
    ):
        assert (mine, theirs) == ([4], [0])  # held: the next command takes another
    with warm_pool.claimed_slots(2) as slots:
        assert slots == [0, 1]  # none living: the lowest free
    with (
        warm_pool.claimed_slots(2) as workers,
        warm_pool.claimed_slots(2, prefix=warm_pool.SIMULATOR) as simulators,
    ):
        assert workers == simulators == [0, 1]  # warm simulators' slots are apart from workers'


def test_a_gpu_worker_gets_one_cuda_work_queue_unless_the_user_chose() -> None:
    from trainforge.worker import environment

    assert environment.gpu_worker_env({}) == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
    chosen = {"CUDA_DEVICE_MAX_CONNECTIONS": "8", "PATH": "/bin"}
    assert environment.gpu_worker_env(chosen) == {"CUDA_DEVICE_MAX_CONNECTIONS": "8"}


def test_a_warm_run_gives_each_rank_the_variables_a_ray_train_worker_has(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from trainforge.worker import environment
    from trainforge.worker.process_group import Place
    from trainforge.workloads.sbi import workload

    def rank_env(rank: int, world_size: int) -> dict[str, str]:
        return Place.on_one_machine(rank, world_size).env()

    monkeypatch.delenv("LOCAL_WORLD_SIZE", raising=False)
    assert rank_env(1, 4) == {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "4",
                              "LOCAL_WORLD_SIZE": "4", "NODE_RANK": "0"}  # fmt: skip
    import psutil

    # the SBI workload's memory rule counts every worker on the machine: what one worker may
    # load alone, four may not
    one_quarter = psutil.virtual_memory().available // (workload.HOST_COPIES * 3)
    with environment.applied(rank_env(0, 1)):
        assert workload._fits_in_host_memory(one_quarter)
    with environment.applied(rank_env(0, 4)):
        assert not workload._fits_in_host_memory(one_quarter)
    assert "LOCAL_WORLD_SIZE" not in os.environ  # the next command's run starts clean


def test_a_runs_cyclic_garbage_is_freed_and_the_survivors_leave_later_collections() -> None:
    class Model:  # a run's object kept alive only by a cycle, as the loop's often are
        def __init__(self) -> None:
            self.weights = torch.zeros(1000)
            self.me = self

    survivor = [[] for _ in range(1000)]  # what outlives a run (tracked by the collector)
    garbage = Model()
    freed = weakref.ref(garbage)
    del garbage
    frozen_before = gc.get_freeze_count()
    try:
        warm.release_run_memory()
        assert freed() is None, "the cycle was frozen instead of collected"
        assert gc.get_freeze_count() >= frozen_before + len(survivor)

        next_run = Model()  # the next run's cycles are still collected
        freed = weakref.ref(next_run)
        del next_run
        warm.release_run_memory()
        assert freed() is None
    finally:
        gc.unfreeze()  # this test process goes on collecting as before
