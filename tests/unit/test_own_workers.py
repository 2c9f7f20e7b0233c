"""A cold command's own workers, their parts in this process (``driver/workers/own.py``,
``worker/own.py``) and the cluster's start in the background after them
(``driver/background.py``): which commands run on them, what the machine offers without Ray,
how a worker's exception crosses back. Their whole path — a real command, a failure and
restart, a Ctrl-C and a SIGKILL — is in tests/integration/test_worker_groups.py and
tests/integration/test_local_cluster.py."""

from __future__ import annotations

import fcntl
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from trainforge import cli, settings
from trainforge.driver import background, local_cluster
from trainforge.driver.workers import own
from trainforge.driver.workers.base import how_it_ended
from trainforge.errors import NonFiniteLoss, RecipeError
from trainforge.worker.own import portable

HOME_ENV = settings.HOME.name


def recipe(kind: str = "cnn", use_gpu: str = "auto", **resources: float) -> SimpleNamespace:
    return SimpleNamespace(
        scaling=SimpleNamespace(use_gpu=use_gpu, resources_per_worker=resources),
        workload=SimpleNamespace(kind=kind),
    )


def a_users_command(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, joined_ray: bool = False
) -> None:
    """A command as a user runs it: a home where no cluster runs, none of the test session's
    settings (conftest.py), and unless ``joined_ray`` no Ray joined in its process (a Ray test
    before this one in the same test process joined this session's)."""
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    for name in (settings.WORKERS.name, "RAY_ADDRESS"):
        monkeypatch.delenv(name, raising=False)
    if not joined_ray:
        monkeypatch.setattr(own, "_connected_to_ray", lambda: False)


def test_which_commands_train_on_their_own_workers(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    a_users_command(monkeypatch, tmp_path)
    local = str(tmp_path / "runs")
    workers = settings.WORKERS.name

    def why(cfg: SimpleNamespace | None = None, storage: str = local) -> str | None:
        return own.unavailable(cfg or recipe(), storage)  # type: ignore[arg-type]

    assert why() is None
    assert why(recipe(use_gpu="true", GPU=1)) is None
    assert why(recipe(use_gpu="true", GPU=2)) == "workers of other than one GPU each"
    assert why(storage="s3://bucket/runs") == "remote storage"
    for choice in ("warm", "ray-train", "private"):  # another worker group was asked for
        monkeypatch.setenv(workers, choice)
        assert why() == f"{workers}={choice}"
    monkeypatch.delenv(workers)
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    assert why() == "RAY_ADDRESS names a cluster"
    monkeypatch.delenv("RAY_ADDRESS")
    monkeypatch.setenv(workers, "own")  # no cluster kept: none is needed either
    assert why() is None
    monkeypatch.setenv(workers, "ownn")
    with pytest.raises(RecipeError, match=r"TRAINFORGE_WORKERS: 'ownn' is not one of auto, own"):
        why()


def test_while_a_background_start_readies_the_cluster_a_command_trains_on_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A cluster that runs is used, unless a background start is readying it: its warm
    workers would be importing or rehearsing, and the command would wait for them."""
    import json
    import socket
    from dataclasses import asdict

    a_users_command(monkeypatch, tmp_path)
    with socket.socket() as gcs:  # a GCS that answers, under a supervisor that lives
        gcs.bind(("127.0.0.1", 0))
        gcs.listen()
        cluster = local_cluster.ClusterState(
            gcs_address=f"127.0.0.1:{gcs.getsockname()[1]}", dashboard_url="",
            supervisor_pid=os.getpid(), temp_dir="", python=local_cluster._python(),
            ray_version=local_cluster._ray_version(), started_at=0.0, single_node=True,
        )  # fmt: skip
        local_cluster.folder().mkdir(parents=True)
        (local_cluster.folder() / "state.json").write_text(json.dumps(asdict(cluster)))
        assert own.unavailable(recipe(), str(tmp_path)) == "the local cluster runs"  # type: ignore[arg-type]
        with open(local_cluster.background_lock_path(), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # as a background start holds it
            assert own.unavailable(recipe(), str(tmp_path)) is None  # type: ignore[arg-type]
            assert own.phase_line(recipe()) == (  # type: ignore[arg-type]
                "ray: the local cluster is being readied in the background for later commands; "
                "this run's workers are processes of this command"
            )


@pytest.mark.ray
def test_a_process_connected_to_ray_trains_there(
    ray_cluster, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A script or notebook that called ``ray.init`` before ``launch.train``: its run goes to
    that Ray, not to processes of its own."""
    a_users_command(monkeypatch, tmp_path, joined_ray=True)
    for choice in ("auto", "own"):
        monkeypatch.setenv(settings.WORKERS.name, choice)
        why = own.unavailable(recipe(), str(tmp_path / "runs"))  # type: ignore[arg-type]
        assert why == "this process is connected to Ray"


def test_an_sbi_stage_that_spreads_over_the_cluster_needs_it(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Where a cluster is kept, a stage spread over it starts it and its warm workers train;
    with ``own`` the stage gets a private Ray and the workers stay the command's."""
    from tests.conftest import RECIPES
    from trainforge import config

    a_users_command(monkeypatch, tmp_path)
    built_in = config.load(RECIPES / "sbi" / "two_moons_debug.yaml")  # seconds of one core
    custom = RECIPES / "sbi" / "sir_custom.yaml"  # a user's simulator: its cost is unknown
    spread, here = config.load(custom), config.load(custom, ["workload.simulation.where=here"])
    made = config.load(custom, ["workload.simulation.path=/data/sims"])
    assert own.unavailable(built_in, str(tmp_path)) is None  # made by the command
    assert own.unavailable(spread, str(tmp_path)) == "its data stage runs on the cluster"
    assert own.unavailable(here, str(tmp_path)) is None
    assert own.unavailable(made, str(tmp_path)) is None  # nothing to simulate
    monkeypatch.setenv(settings.WORKERS.name, "own")
    assert own.unavailable(spread, str(tmp_path)) is None
    assert own.phase_line(spread) == (
        "ray: a private one for this command's data stage only (TRAINFORGE_WORKERS=own: nothing "
        "outlives it); this run's workers are processes of this command"
    )
    assert own.phase_line(built_in).startswith("ray: none for this command")


def test_a_worker_process_end_is_said_in_words_a_user_acts_on() -> None:
    """From a real process's return code: a SIGKILL (the OOM killer's signal) names memory."""
    killed = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    killed.kill()
    assert how_it_ended(killed.wait()) == (
        "was killed by SIGKILL (out of memory: the kernel's OOM killer; or a kill -9)"
    )
    crashed = subprocess.run([sys.executable, "-c", "import os; os.abort()"], timeout=60,
                             capture_output=True)  # fmt: skip
    assert how_it_ended(crashed.returncode) == (
        "crashed (SIGABRT: a fault in native code, or an abort)"
    )
    assert how_it_ended(-signal.SIGTERM) == "was stopped by SIGTERM"
    assert how_it_ended(3) == "ended with exit code 3"


def test_the_gpus_a_new_process_would_see(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 5")
    assert own.visible_gpus() == ["2", "5"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert own.visible_gpus() == []
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert own.visible_gpus() == []
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    expected = len(os.listdir("/proc/driver/nvidia/gpus")) if os.path.isdir(
        "/proc/driver/nvidia/gpus") else None  # fmt: skip
    if expected is not None:
        assert len(own.visible_gpus()) == expected
    resources = own.resources()
    assert resources["CPU"] == len(os.sched_getaffinity(0))


def test_a_worker_exception_crosses_back_as_itself_or_as_text() -> None:
    verdict = portable(NonFiniteLoss("loss is nan at step 12"))
    assert isinstance(pickle.loads(pickle.dumps(verdict)), NonFiniteLoss)  # the run's own stop

    class Unbuildable(Exception):  # pickle cannot rebuild it: __init__ wants two arguments
        def __init__(self, a: int, b: int) -> None:
            super().__init__(f"{a}/{b}")

    try:
        raise Unbuildable(1, 2)
    except Unbuildable as exc:
        crossed = pickle.loads(pickle.dumps(portable(exc)))
    assert isinstance(crossed, RuntimeError)
    assert str(crossed).startswith("Unbuildable: 1/2\n")
    assert "raise Unbuildable(1, 2)" in str(crossed)  # the worker's traceback, as text


def test_a_background_start_under_way_is_not_waited_for(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Another command's background start holds its lock: this command starts no second one
    and ends at once (it used to wait for the lock, 40 s after a cluster stop)."""
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    assert background.wait(0.1)  # no folder yet: nothing to wait for
    home = local_cluster.folder()
    home.mkdir(parents=True)
    with open(home / "background.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as the other command's background process does
        background.start_cluster(recipe())  # type: ignore[arg-type]
        assert not background.wait(0.2)  # still the other one's
    assert "being started in the background by another command" in capsys.readouterr().out
    assert not (home / "background.log").read_bytes()  # no process of this command wrote there
    assert background.wait(1)


def test_cluster_status_during_a_background_start_says_it_is_being_started(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Right after a command that ran without the cluster, its background start is bringing
    Ray up: `cluster status` says so (it said no cluster runs), still with exit 1."""
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    home = local_cluster.folder()
    home.mkdir(parents=True)
    with open(home / "background.lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as the command's background process does
        assert cli.main(["cluster", "status"]) == 1
    assert capsys.readouterr().out == (
        "[trainforge] the local cluster is being started in the background, for later commands "
        f"(its log: {home / 'background.log'})\n"
    )
    assert cli.main(["cluster", "status"]) == 1  # the start ended without a cluster
    assert "no local cluster is running" in capsys.readouterr().out


BACKGROUND_START = """
import fcntl, os, sys, time
lock = open(sys.argv[1], "a")
fcntl.flock(lock, fcntl.LOCK_EX)
lock.truncate(0)
lock.write(f"{os.getpid()}\\n")
lock.flush()
print("holding", flush=True)
time.sleep(120)
"""


def test_cluster_stop_during_a_background_start_ends_that_start_first(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A process holds the background start's lock with its pid in it, as a command's
    background start does: `cluster stop` says it ends that start, SIGTERMs the process, waits
    for its lock, then stops the cluster (none here). The whole way, with a real background
    start and `cluster start --num-cpus`, is in tests/integration/test_local_cluster.py."""
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    local_cluster.folder().mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", BACKGROUND_START, str(local_cluster.background_lock_path())],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
        began = time.monotonic()
        assert cli.main(["cluster", "stop"]) == 0
        assert holder.wait(timeout=5) == -signal.SIGTERM
        assert time.monotonic() - began < 10
    finally:
        holder.kill()
    assert capsys.readouterr().out == (
        "[trainforge] a background start of the local cluster is under way: ending it first\n"
        "[trainforge] no local cluster was running\n"
    )
    assert not local_cluster.background_start_running()


STOPPED_WHILE_STARTING = """
import os, signal
from trainforge.driver.background import StopAsked, _StopOnTerm
stop = _StopOnTerm()
os.kill(os.getpid(), signal.SIGTERM)  # while the cluster starts: only noted
print("went on", flush=True)
try:
    stop.start_done()
except StopAsked:
    print("stopped once started", flush=True)
os.kill(os.getpid(), signal.SIGTERM)  # later: at once
"""


def test_a_stop_asked_while_the_background_start_starts_the_cluster_waits_for_that_start() -> None:
    """`trainforge cluster stop` SIGTERMs a background start: in the cluster's start it ends
    once that start is over (the supervisor, a process apart, would bring Ray up after the
    stop), anywhere else at once, as a Ctrl-C would."""
    done = subprocess.run([sys.executable, "-c", STOPPED_WHILE_STARTING], capture_output=True,
                          text=True, timeout=60)  # fmt: skip
    assert done.stdout == "went on\nstopped once started\n", done.stdout + done.stderr
    assert done.returncode == 1 and done.stderr.rstrip().endswith("StopAsked"), done.stderr


def test_a_command_says_whether_its_background_start_starts_the_cluster_or_found_it() -> None:
    assert background.start_line(2, None) == (
        "ray: starting the local cluster and 2 warm workers in the background for later commands"
    )
    came_up = local_cluster.ClusterState(
        gcs_address="127.0.0.1:6380", dashboard_url="", supervisor_pid=1, temp_dir="",
        python="", ray_version="", started_at=0.0,
    )  # fmt: skip
    assert background.start_line(1, came_up) == (
        "ray: the local cluster at 127.0.0.1:6380 came up while this command ran; readying 1 "
        "warm worker there in the background for later commands"
    )


def test_a_warm_worker_busy_with_a_rehearsal_is_waited_for_and_a_hung_one_replaced(
    ray_cluster: None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A command asks a warm worker whether it serves it; the worker answers once its current
    call ends. While a background start runs (its lock held), a busy worker is rehearsing: the
    command waits past ``ANSWER_S`` and says so once. Without one, a worker silent for
    ``ANSWER_S`` is hung, and the command replaces it."""
    import ray

    from trainforge.driver import warm_pool

    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    monkeypatch.setattr(warm_pool, "ANSWER_S", 1.0)
    local_cluster.folder().mkdir(parents=True)
    assert not local_cluster.background_start_running()

    @ray.remote(num_cpus=0)
    class Busy:
        def work(self, seconds: float) -> None:
            time.sleep(seconds)

        def serve(self) -> None:
            return None

    worker = Busy.remote()  # type: ignore[attr-defined]
    ray.get(worker.serve.remote())  # started
    with open(local_cluster.background_lock_path(), "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as the background start's process does
        assert local_cluster.background_start_running()
        worker.work.remote(3.0)  # the rehearsal: longer than ANSWER_S
        started = time.monotonic()
        assert warm_pool._ask(ray, worker.serve.remote()) is None
        assert time.monotonic() - started > 2.0
    said = capsys.readouterr().out
    assert said.count("waiting for the background start to finish its rehearsal") == 1
    assert not local_cluster.background_start_running()
    worker.work.remote(3.0)  # no background start: a worker this slow to answer is hung
    assert warm_pool._ask(ray, worker.serve.remote()) == "it did not answer in 1 s"
    assert "rehearsal" not in capsys.readouterr().out
    ray.kill(worker)


def test_a_worker_imports_what_the_workload_names_at_its_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real worker process (``worker/own.py``) given its first message imports the workload's
    ``worker_imports`` at once, before any run is sent: while the command makes the data. Here
    the module says so by writing a file; closing the connection then ends the process."""
    import socket
    import subprocess
    import sys
    from multiprocessing.connection import Connection

    from trainforge.workloads import spec_for

    assert "sbi.neural_nets" in spec_for("sbi").worker_imports
    assert spec_for("cnn").worker_imports == ()
    said = tmp_path / "imported"
    (tmp_path / "tf_probe_worker_import.py").write_text(f"open({str(said)!r}, 'w').close()\n")
    ours, theirs = socket.socketpair()
    with theirs:
        process = subprocess.Popen(
            [sys.executable, "-m", "trainforge.worker.own", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),), env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
    connection = Connection(ours.detach())
    path = [str(tmp_path), *sys.path]
    connection.send((path, os.getpid(), None, ("tf_probe_worker_import",)))
    deadline = time.monotonic() + 120
    while not said.exists() and time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.05)
    assert said.exists(), f"not imported; the worker ended with {process.poll()}"
    connection.close()
    assert process.wait(timeout=60) == 0
