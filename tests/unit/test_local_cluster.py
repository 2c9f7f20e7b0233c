"""The lasting local Ray cluster's bookkeeping (``trainforge.driver.local_cluster``) without a
cluster: its switch and folder, the state file, staleness, the workers' environment, the in-use
lock and stopping a supervisor. Real clusters: tests/integration/test_local_cluster.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from trainforge.driver import background, cluster_footprint, local_cluster, orphans
from trainforge.driver.local_cluster import ClusterState
from trainforge.worker import environment


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TRAINFORGE_HOME", str(tmp_path))
    return tmp_path


def state(pid: int, port: int = 1, python: str | None = None) -> ClusterState:
    return ClusterState(
        gcs_address=f"127.0.0.1:{port}",
        dashboard_url="http://127.0.0.1:2",
        supervisor_pid=pid,
        temp_dir="/tmp/trainforge-test",
        python=python or local_cluster._python(),
        ray_version=local_cluster._ray_version(),
        started_at=1.0,
        single_node=True,
    )


def write_state(cluster: ClusterState) -> Path:
    path = local_cluster.folder() / "state.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(cluster)))
    return path


def holds_nobody(path: Path) -> bool:
    """Whether the supervisor could hold the lock alone (``_hold_alone``), asked from another
    process (flock locks belong to open files, so this process would always get its own)."""
    code = (
        "import sys; from pathlib import Path; "
        "from trainforge.driver.local_cluster import _hold_alone; "
        "print(_hold_alone(Path(sys.argv[1])) is not None)"
    )
    answer = subprocess.run(
        [sys.executable, "-c", code, str(path)], capture_output=True, text=True, check=True
    )
    return {"True": True, "False": False}[answer.stdout.strip()]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_cluster_keeps_no_mlflow_setting_of_the_command_that_started_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each command hands its MLflow settings (store, credentials) to the workers itself; the
    cluster's would be seen by later commands that set none."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:////first/project/mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "first-users-secret")
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    env = local_cluster._supervisor_env()
    assert not [key for key in env if key.startswith("MLFLOW_")]
    assert env["OMP_NUM_THREADS"] == "3"  # the machine's settings stay
    assert local_cluster.worker_env()["MLFLOW_TRACKING_URI"] == "sqlite:////first/project/mlflow.db"


def test_folder_follows_trainforge_home(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert local_cluster.folder() == home / "local-cluster"
    monkeypatch.setenv("TRAINFORGE_HOME", str(home / "other"))
    assert local_cluster.folder() == home / "other" / "local-cluster"
    assert state(1).token_path == str(home / "other" / "local-cluster" / "token")


def test_state_file(home: Path) -> None:
    assert local_cluster.read_state() is None  # none written
    cluster = state(os.getpid(), port=6379)
    path = write_state(cluster)
    assert path == home / "local-cluster" / "state.json"
    assert local_cluster.read_state() == cluster
    for corrupt in ("{not json", "[1, 2]", json.dumps({"gcs_address": "127.0.0.1:1"})):
        path.write_text(corrupt)
        assert local_cluster.read_state() is None, corrupt


def test_a_dead_supervisor_is_stale() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    reason = local_cluster.why_stale(state(gone.pid))
    assert reason == f"its supervisor (pid {gone.pid}) is gone"


def test_a_pid_that_names_no_process_is_stale() -> None:
    # 0 and -1 are process groups to kill() and waitpid(): never taken for a supervisor
    for pid in (0, -1):
        assert local_cluster.why_stale(state(pid)) == f"its supervisor (pid {pid}) is gone"


def test_another_python_is_stale() -> None:
    reason = local_cluster.why_stale(state(os.getpid(), python="/opt/other/bin/python3"))
    assert reason is not None
    assert "/opt/other/bin/python3" in reason and local_cluster._ray_version() in reason


def test_a_silent_gcs_is_stale_and_an_answering_one_is_not() -> None:
    port = free_port()  # closed again: nothing listens there
    assert local_cluster.why_stale(state(os.getpid(), port)) == (
        f"its GCS at 127.0.0.1:{port} does not answer"
    )
    with socket.socket() as gcs:
        gcs.bind(("127.0.0.1", 0))
        gcs.listen()
        cluster = state(os.getpid(), gcs.getsockname()[1])
        assert local_cluster.why_stale(cluster) is None
        # one an earlier trainforge started listens beyond 127.0.0.1: replaced, not joined
        earlier = json.loads(json.dumps(asdict(cluster)))
        del earlier["single_node"]
        assert local_cluster.why_stale(ClusterState(**earlier)) == (
            "an earlier trainforge started it listening beyond 127.0.0.1"
        )


SETTINGS = {
    "OMP_NUM_THREADS": "1",
    "MLFLOW_TRACKING_URI": "sqlite:///mlflow.db",
    "TRAINFORGE_X": "y",
    "PYTHONPATH": "/src",
    "NCCL_DEBUG": "INFO",
}
USERS_OWN = {"MYSIM_DATA": "/data/run7", "PATH": "/opt/solver/bin:/usr/bin",
             "AWS_SECRET_ACCESS_KEY": "secret"}  # fmt: skip
PROCESS_OWN = {"RAY_ADDRESS": "127.0.0.1:1", "CUDA_VISIBLE_DEVICES": "0,1", "RANK": "3",
               "MASTER_PORT": "29500", "PWD": "/home/u"}  # fmt: skip


def test_a_cluster_the_user_runs_gets_the_commands_settings_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``ray job submit``, KubeRay, SLURM: workers on other machines, whose environment is the
    cluster's and the job's runtime env."""
    for key, value in {**SETTINGS, **USERS_OWN, **PROCESS_OWN}.items():
        monkeypatch.setenv(key, value)
    env = local_cluster.worker_env(whole=False)
    assert {key: env.get(key) for key in SETTINGS} == SETTINGS
    assert not (set(USERS_OWN) | set(PROCESS_OWN)) & set(env)
    assert local_cluster.worker_env() == env  # this process joined no lasting cluster


def test_the_lasting_cluster_gets_the_commands_whole_environment_but_each_processs_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Started in the background by an earlier command: a user's simulator reading a variable
    of its own must see this command's value. Each worker keeps its devices, rank and Ray's
    settings, and what the command lacks (Ray set the thread count of its process)."""
    for key, value in {**SETTINGS, **USERS_OWN, **PROCESS_OWN}.items():
        monkeypatch.setenv(key, value)
    env = local_cluster.worker_env(whole=True)
    wanted = SETTINGS | USERS_OWN
    assert {key: env.get(key) for key in wanted} == wanted
    assert not set(PROCESS_OWN) & set(env)

    worker = {"RAY_ADDRESS": "127.0.0.1:2", "CUDA_VISIBLE_DEVICES": "1", "RANK": "0",
              "OMP_NUM_THREADS": "2", "MYSIM_DATA": "/data/old", "RAY_SET_THIS": "1"}  # fmt: skip
    env.pop("OMP_NUM_THREADS")  # a command that sets no thread count
    env.pop("PYTHONPATH")  # (it would extend this process's sys.path)
    monkeypatch.setattr(os, "environ", dict(worker))  # a warm worker's own environment
    with environment.applied(env):
        assert os.environ["MYSIM_DATA"] == "/data/run7"
        assert os.environ["PATH"] == "/opt/solver/bin:/usr/bin"
        kept = {key: os.environ[key] for key in worker if key != "MYSIM_DATA"}
        assert kept == {key: value for key, value in worker.items() if key != "MYSIM_DATA"}
    assert os.environ == worker  # the next command's run sees none of this one's


def test_in_use_holds_the_lock_and_restarts_the_idle_clock() -> None:
    path = local_cluster.folder() / "in-use.lock"
    with local_cluster.in_use():
        assert path.exists()
        assert holds_nobody(path) is False
        an_hour_ago = time.time() - 3600
        os.utime(path, (an_hour_ago, an_hour_ago))
        assert local_cluster._idle_for(path) > 3000
    assert holds_nobody(path) is True
    idle = local_cluster._idle_for(path)
    assert 0 <= idle < 60  # touched when the command let go
    time.sleep(0.05)
    assert local_cluster._idle_for(path) > idle


def test_stop_without_a_cluster() -> None:
    assert local_cluster.stop() is False


def test_stop_terminates_the_supervisor(tmp_path: Path) -> None:
    marker = tmp_path / "terminated"
    code = (
        "import pathlib, signal, sys, time\n"
        "def on_term(signum, frame):\n"
        f"    pathlib.Path({str(marker)!r}).write_text('SIGTERM')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, on_term)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    supervisor = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert supervisor.stdout is not None and supervisor.stdout.readline() == "ready\n"
        path = write_state(state(supervisor.pid))
        started = time.monotonic()
        assert local_cluster.stop(timeout_s=10) is True
        # it ended on the SIGTERM within the wait, not on the SIGKILL after it
        assert time.monotonic() - started < 5
        assert marker.read_text() == "SIGTERM"
        assert not path.exists()
        supervisor.wait(timeout=5)
        assert not local_cluster._alive(supervisor.pid)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
        if supervisor.stdout is not None:
            supervisor.stdout.close()


def test_a_dead_supervisors_processes_are_found_by_their_environment_and_stopped() -> None:
    """What a killed supervisor leaves: processes started with the cluster's RAY_ADDRESS (one
    that ignores SIGTERM among them); `stop` ends them all, another cluster's survive, and a
    command about to replace the cluster says why."""
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    cluster = state(gone.pid, port=free_port())
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    env = {**os.environ, "RAY_ADDRESS": cluster.gcs_address}
    left = [subprocess.Popen([sys.executable, "-c", code + "print(1, flush=True); time.sleep(60)"],
                             env=env, stdout=subprocess.PIPE)
            for code in ("import time; ", stubborn)]  # fmt: skip
    # another cluster's, at an address of its own: no other test's stale cluster has it
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                             env={**env, "RAY_ADDRESS": f"127.0.0.1:{free_port()}"})  # fmt: skip
    try:
        write_state(cluster)
        for process in left:  # started, SIGTERM ignored where it is to be
            assert process.stdout is not None and process.stdout.readline() == b"1\n"
        assert sorted(orphans.of_cluster(cluster.gcs_address)) == sorted(p.pid for p in left)
        assert local_cluster.replacing_line(cluster) == (
            f"ray: the local cluster from an earlier session is unusable (its supervisor "
            f"(pid {gone.pid}) is gone); replacing it"
        )
        assert local_cluster.stop() is True  # there was one: its processes
        assert [p.wait(timeout=10) for p in left] == [-signal.SIGTERM, -signal.SIGKILL]
        assert other.poll() is None and not (local_cluster.folder() / "state.json").exists()
    finally:
        for process in [*left, other]:
            process.kill()
            process.wait()
            if process.stdout is not None:
                process.stdout.close()


def test_the_clusters_ray_start_leaves_out_the_other_command_groups_imports() -> None:
    """`ray start` through ``ray_cli``: the CLI still has `start` with its options, and Ray Serve
    (FastAPI, pandas: ~2 s of a cold start) was never imported for it."""
    probe = (
        "import sys\n"
        "from trainforge.driver import ray_cli\n"
        "ray_cli.skip_unused_command_groups()\n"
        "from ray.scripts import scripts\n"
        "print(sorted(set(scripts.cli.commands) & {'start', 'serve', 'job', 'list'}))\n"
        "print('ray.serve' in sys.modules, 'ray.util.state' in sys.modules)\n"
    )
    found = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           timeout=120, check=True).stdout.splitlines()  # fmt: skip
    assert found == ["['start']", "False False"]
    usage = subprocess.run(
        [sys.executable, "-m", "trainforge.driver.ray_cli", "start", "--help"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert usage.returncode == 0, usage.stderr
    assert "--head" in usage.stdout and "--block" in usage.stdout


def test_a_command_that_finds_another_starting_the_cluster_uses_it_and_did_not_start_it() -> None:
    """Two commands at once with no cluster: the second waits on the start lock, finds the
    first one's cluster there, and says it connected, not that it started one."""
    gcs = socket.socket()
    gcs.bind(("127.0.0.1", 0))
    gcs.listen()
    theirs = state(os.getpid(), port=gcs.getsockname()[1])  # a live supervisor, a GCS answering
    home = local_cluster.folder()
    home.mkdir(parents=True, exist_ok=True)
    found: list[tuple[ClusterState, bool]] = []
    with local_cluster._start_lock(home):  # the other command, starting
        waiting = threading.Thread(target=lambda: found.append(local_cluster.ensure(print)))
        waiting.start()
        time.sleep(0.3)
        assert not found  # waits for that start
        write_state(theirs)
    waiting.join(10)
    gcs.close()
    assert found == [(theirs, False)]


def test_the_cost_of_the_cluster_is_said_once_per_home(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first command that starts the lasting cluster says what it holds, when it stops and
    the setting under which nothing outlives a command; later commands, and another command's
    start beside it, say nothing more. Another home is told again."""
    monkeypatch.setenv("TRAINFORGE_CLUSTER_IDLE_S", "900")
    first = cluster_footprint.cost_line(2)
    assert first == (
        "ray: the local cluster holds about 1.8 GB of memory (Ray, 2 warm workers and a tracker) "
        "until 15 min unused or `trainforge cluster stop`; with TRAINFORGE_WORKERS=own nothing "
        "outlives a command (said once; `trainforge cluster status` shows what it holds)"
    )
    assert cluster_footprint.cost_line(2) is None
    assert cluster_footprint.cost_line(None) is None  # a command that started it in front
    monkeypatch.setenv("TRAINFORGE_HOME", str(home / "another-user"))
    again = cluster_footprint.cost_line(None)
    assert again is not None and again.startswith(
        "ray: the local cluster holds about 0.75 GB of memory, and 0.35 GB per warm worker until "
        "15 min unused"
    )


SINGLE_NODE_CLIENT = """
from ray._private import services
from trainforge.driver import local_cluster
before = services.canonicalize_bootstrap_address("127.0.0.1:6380")
local_cluster.single_node_client()
print(before, services.canonicalize_bootstrap_address("127.0.0.1:6380"))
"""


def test_the_supervisor_starts_ray_in_its_single_node_mode() -> None:
    """Ray's single-node mode binds every port to 127.0.0.1 (checked on a real cluster:
    tests/integration/test_local_cluster.py); a client in it resolves 127.0.0.1 to itself.
    The client in a process of its own: one that joined another Ray takes that node's address."""
    assert local_cluster._supervisor_env()["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0"
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1"}  # Ray imported as a cluster
    done = subprocess.run([sys.executable, "-c", SINGLE_NODE_CLIENT], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = done.stdout.split()
    assert before != "127.0.0.1:6380" and after == "127.0.0.1:6380", done.stdout


HOLD_TRAINING_LOCK = """
import sys, time
from trainforge.driver import background
with background.training_here():
    print("holding", flush=True)
    time.sleep(float(sys.argv[1]))
"""


def test_a_background_start_waits_while_a_command_trains_on_its_own_processes() -> None:
    """A command that trains on processes of its own holds a shared lock; a background start
    waits for every such command to end before each of its steps, and at once when stopped."""
    assert not background.commands_training()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_TRAINING_LOCK, "2"],
                              stdout=subprocess.PIPE, text=True)  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline() == "holding\n"
    assert background.commands_training()
    began = time.monotonic()
    background.yield_cores(lambda: True)  # asked to stop: no wait
    assert time.monotonic() - began < 0.5
    background.yield_cores(lambda: False)
    waited = time.monotonic() - began
    assert holder.wait(timeout=10) == 0
    assert 1.0 < waited < 6.0, waited  # until the holder ended (~2 s after its start)
    assert not background.commands_training()
    began = time.monotonic()
    background.yield_cores(lambda: False, grace_s=0.6)  # nobody trains: the grace alone
    assert 0.6 <= time.monotonic() - began < 2.0
