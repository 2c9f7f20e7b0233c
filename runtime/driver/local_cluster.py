"""The local Ray cluster that outlives one command.

Starting Ray costs ~5 s on a 2-core machine and stopping it ~4 s more; a user who runs ten
short jobs pays that ten times. The first ``trainforge train`` (or ``trainforge cluster
start``) therefore starts a Ray head of its own — on loopback, with token authentication and
ports of its own, its own temp dir — under a small supervisor process, and later commands
connect to it. The supervisor stops Ray when no command has used it for ``idle_stop_s``
(default 30 min) and no command holds it, or on ``trainforge cluster stop``; stopping it never
touches any other Ray on the machine (``ray stop`` would).

Everything lives in one folder per user (``$TRAINFORGE_HOME/local-cluster``, default
``~/.cache/trainforge``): ``state.json`` (addresses, supervisor pid, Python and Ray versions),
``token`` (mode 0600), ``in-use.lock`` (each command holds a shared lock on it while it runs),
``supervisor.log``. A state whose supervisor is dead, whose GCS does not answer, or that was
started by another Python or Ray version is stale: it is stopped if it can be and replaced.
Two users have two homes, hence two clusters, tokens and port sets.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from trainforge import settings
from trainforge.driver import orphans
from trainforge.worker import environment

START_ATTEMPTS = 3  # supervisors started, each with new ports, before `start` gives up
# How long the supervisor gives `ray start --block` to stop its node after SIGTERM.
RAY_STOP_TIMEOUT_S = 30.0
START_TIMEOUT_S = 120.0


joined = threading.Event()
"""Set once this process has joined the lasting local cluster (``cluster.connect``)."""


def on_lasting_cluster() -> bool:
    """Whether this process joined the lasting local cluster."""
    return joined.is_set()


def folder() -> Path:
    return settings.home() / "local-cluster"


def background_lock_path() -> Path:
    """Held by a background start (``background.start_cluster``) until it ends; it holds the
    pid of that start's process (``background.stop``)."""
    return folder() / "background.lock"


def background_log_path() -> Path:
    """What a background start says, for `trainforge cluster status` to point at."""
    return folder() / "background.log"


def background_start_running() -> bool:
    """Whether a background start holds its lock now. Probed with a shared lock, held for an
    instant: a background start that tries its exclusive lock at that very instant starts
    nothing, as when another one runs."""
    try:
        with open(background_lock_path(), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    except OSError:  # no folder: nothing was ever started here
        return False
    return False


@dataclass(frozen=True)
class ClusterState:
    gcs_address: str
    dashboard_url: str
    supervisor_pid: int
    temp_dir: str
    python: str
    ray_version: str
    started_at: float
    single_node: bool = False
    """Started in Ray's single-node mode (``SINGLE_NODE``): a cluster an earlier trainforge
    started without it is stale, as a client in that mode cannot join it."""

    @property
    def token_path(self) -> str:
        return str(folder() / "token")


def read_state() -> ClusterState | None:
    try:
        return ClusterState(**json.loads((folder() / "state.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def why_stale(state: ClusterState) -> str | None:
    """None when the cluster can be used, else why not (one phrase)."""
    if not _alive(state.supervisor_pid):
        return f"its supervisor (pid {state.supervisor_pid}) is gone"
    if state.python != _python() or state.ray_version != _ray_version():
        return f"it runs {state.python} with Ray {state.ray_version}"
    if not state.single_node:
        return "an earlier trainforge started it listening beyond 127.0.0.1"
    host, port = state.gcs_address.rsplit(":", 1)
    if not _port_open(host, int(port)):
        return f"its GCS at {state.gcs_address} does not answer"
    return None


def running() -> ClusterState | None:
    state = read_state()
    return state if state is not None and why_stale(state) is None else None


def ensure(say: Any) -> tuple[ClusterState, bool]:
    """The running cluster, else a new one (replacing a stale one); True when started now."""
    state = read_state()
    if state is not None:
        replacing = replacing_line(state)
        if replacing is None:
            return state, False
        say(replacing)
        stop(state)
    return _start()


def replacing_line(state: ClusterState) -> str | None:
    """The line for a cluster left unusable (its supervisor killed, another Python or Ray),
    which a start replaces; None where it can be used."""
    reason = why_stale(state)
    if reason is None:
        return None
    return f"ray: the local cluster from an earlier session is unusable ({reason}); replacing it"


def start(idle_s: float | None = None, num_cpus: int | None = None) -> ClusterState:
    """Start the supervisor (detached: it outlives this process) and wait for Ray to answer."""
    return _start(idle_s, num_cpus)[0]


def _start(idle_s: float | None = None, num_cpus: int | None = None) -> tuple[ClusterState, bool]:
    """``start``, and whether this command started the cluster: another command starting one
    at the same moment holds the start lock, and its cluster is used (this command says it
    connected, not that it started one)."""
    home = folder()
    home.mkdir(parents=True, exist_ok=True)
    with _start_lock(home):
        state = running()  # another command may have started it while we waited
        if state is not None:
            return state, False
        (home / "state.json").unlink(missing_ok=True)
        token = home / "token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        idle = idle_s if idle_s is not None else idle_stop_s()
        command = [sys.executable, "-m", "trainforge.driver.local_cluster", f"--idle-stop={idle}"]
        if num_cpus is not None:
            command += ["--num-cpus", str(num_cpus)]
        for _ in range(START_ATTEMPTS):
            with open(home / "supervisor.log", "ab") as log_file:
                supervisor = subprocess.Popen(
                    command,
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # a Ctrl-C in this terminal does not reach it
                    env=_supervisor_env(),
                    # its folder, not the command's, which the user may delete: every process
                    # Ray starts later (a sweep's trial actor, a new warm worker) begins in it
                    cwd=home,
                )
            state = _wait_for_state(home, supervisor)
            if state is not None:
                return state, True
        raise RuntimeError(
            f"the local Ray cluster did not start ({START_ATTEMPTS} attempts); "
            f"see {home / 'supervisor.log'}"
        )


def stop(state: ClusterState | None = None, timeout_s: float = RAY_STOP_TIMEOUT_S + 15) -> bool:
    """Stop the cluster (its supervisor stops Ray, else its processes are ended here); True
    when one was running."""
    state = state or read_state()
    if state is None:
        return False
    was_alive = _alive(state.supervisor_pid)
    if was_alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(state.supervisor_pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _alive(state.supervisor_pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if _alive(state.supervisor_pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(state.supervisor_pid, signal.SIGKILL)
            deadline = time.monotonic() + 5  # SIGKILL is not instant: wait until it is gone
            while _alive(state.supervisor_pid) and time.monotonic() < deadline:
                time.sleep(0.05)
    # a supervisor that was killed left Ray's processes running: they are ended here (after
    # a supervisor's own stop, any still found were going anyway)
    left = orphans.of_cluster(state.gcs_address)
    orphans.end(left)
    (folder() / "state.json").unlink(missing_ok=True)
    return was_alive or bool(left)


@contextlib.contextmanager
def claimed(say: Any) -> Iterator[tuple[ClusterState, bool]]:
    """The running cluster (else a new one, as ``ensure``), held (``in_use``) for as long as
    the block runs; True when started now. A cluster that stopped itself for being idle between
    the look and the hold is not joined (its Ray is going: connecting would wait a minute for
    its GCS); a new one is started."""
    for _ in range(3):
        state, started = ensure(say)
        with in_use():
            if _still(state):
                yield state, started
                return
    raise RuntimeError(
        f"the local cluster stopped three times as this command reached it; see "
        f"{folder() / 'supervisor.log'}"
    )


@contextlib.contextmanager
def looked_at() -> Iterator[ClusterState | None]:
    """The running cluster, held without counting as use (``trainforge cluster status``): it
    cannot stop itself while the block runs, and its idle clock goes on. None: there is none."""
    state = running()
    if state is None:
        yield None
        return
    with in_use(touch=False):
        yield state if _still(state) else None


@contextlib.contextmanager
def in_use(touch: bool = True) -> Any:
    """Held by a command for as long as it uses the cluster: the supervisor never stops a
    cluster while any command holds it (it stops only holding the lock alone, and a cluster that
    is stopping holds it until it is gone). The lock dies with the process."""
    path = folder() / "in-use.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_SH)
        if touch:
            os.utime(path)
        try:
            yield
        finally:
            if touch:
                os.utime(path)  # the idle clock starts when the last command ends


def _still(state: ClusterState) -> bool:
    """Whether ``state`` is still the published cluster (one that stops unpublishes itself
    first)."""
    current = read_state()
    return current is not None and current.supervisor_pid == state.supervisor_pid


SETTINGS_PREFIXES = (
    "OMP_", "MKL_", "OPENBLAS_", "MLFLOW_", "TRAINFORGE_", "TORCH", "NCCL_", "GLOO_",
)  # fmt: skip
"""What a cluster the user runs is given of the command's environment (``worker_env``)."""


def worker_env(whole: bool | None = None) -> dict[str, str]:
    """The command's environment that its workers must see although they are children of a
    Ray started by an earlier command; a worker takes it on with ``worker/environment.py`` (a
    warm one for the run only).

    On the lasting local cluster (``whole``; by default where this process joined it) that is
    all of it but what belongs to each process (``environment.own``): the cluster is
    trainforge's, started in the background by an earlier command, and a user's simulator or
    model that reads a variable of its own (a data folder, a solver's switch, a binary on
    ``PATH``) must see this command's value, as in a script, not the environment of the
    command that started the cluster. On a cluster
    the user runs (``ray job submit``, KubeRay, SLURM) the workers may be other machines,
    whose environment is theirs and the job's runtime env: only the settings
    (``SETTINGS_PREFIXES``: threads, MLflow, trainforge's switches, torch's and the collective
    libraries') and the Python path."""
    if whole is None:
        whole = on_lasting_cluster()
    if whole:
        return {key: value for key, value in os.environ.items() if not environment.own(key)}
    return {
        key: value
        for key, value in os.environ.items()
        if key.startswith(SETTINGS_PREFIXES) or key == "PYTHONPATH"
    }


# --- the supervisor (python -m trainforge.driver.local_cluster) -------------------------------


def supervise(idle_stop_s: float, num_cpus: int | None) -> int:
    """Run `ray start --head --block` and stop it when idle or asked to (SIGTERM)."""
    home = folder()
    ports = {name: free_port() for name in ("gcs", "dashboard", "client")}
    temp_dir = Path(f"/tmp/trainforge-{os.getuid()}-{ports['gcs']}")
    ray_process = _start_head(ports, temp_dir, num_cpus)
    ready = threading.Event()
    threading.Thread(target=_relay, args=(ray_process.stdout, ready), daemon=True).start()
    stopping = False

    def on_term(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    state = ClusterState(
        gcs_address=f"127.0.0.1:{ports['gcs']}",
        dashboard_url=f"http://127.0.0.1:{ports['dashboard']}",
        supervisor_pid=os.getpid(),
        temp_dir=str(temp_dir),
        python=_python(),
        ray_version=_ray_version(),
        started_at=time.time(),
        single_node=True,
    )
    published = False
    lock_path = home / "in-use.lock"
    lock_path.touch()
    while not stopping and ray_process.poll() is None:
        if not published and ready.is_set():
            _write_json(home / "state.json", asdict(state))
            published = True
            os.utime(lock_path)  # the idle clock starts once commands can reach it
        if published and _idle_for(lock_path) > idle_stop_s:
            alone = _hold_alone(lock_path)  # held until this process ends: no command joins
            if alone is not None:
                print(f"idle for {idle_stop_s:.0f} s: stopping", flush=True)
                (home / "state.json").unlink(missing_ok=True)  # a new command starts a new one
                break
        # Short naps: a SIGTERM's handler runs, but the nap it interrupted goes on to its end,
        # and `stop` waits a bounded time for this process to go.
        time.sleep(0.5)
    _stop_head(ray_process)
    current = read_state()
    if current is not None and current.supervisor_pid == os.getpid():
        (home / "state.json").unlink(missing_ok=True)
    return 0


def _start_head(ports: dict[str, int], temp_dir: Path,
                num_cpus: int | None) -> subprocess.Popen[bytes]:  # fmt: skip
    """`ray start --head --block` on loopback, on ``ports``, its output piped for ``_relay``."""
    command = [
        sys.executable, "-m", "trainforge.driver.ray_cli", "start", "--head", "--block",
        f"--port={ports['gcs']}", "--node-ip-address=127.0.0.1",
        "--dashboard-host=127.0.0.1", f"--dashboard-port={ports['dashboard']}",
        f"--ray-client-server-port={ports['client']}",
        # Port 0: each agent binds a free port and publishes it. A port picked free here may be
        # taken before the agent binds it, and a dashboard agent that cannot bind stays alive
        # without registering (no job agent, no metrics).
        "--dashboard-agent-listen-port=0", "--dashboard-agent-grpc-port=0",
        "--runtime-env-agent-port=0", "--metrics-export-port=0",
        f"--temp-dir={temp_dir}", "--disable-usage-stats",
    ]  # fmt: skip
    num_cpus = num_cpus if num_cpus is not None else usable_cpus()
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus}")
    # Every process of the cluster knows its address: Ray Train's placement-group cleaner asks
    # the State API, which without it would ask the last `ray start` cluster on the machine.
    # No drain on SIGTERM: Ray 2.60's `ray start --block` first waits up to 30 s for the node's
    # leases to come back (for Serve replicas moving to other nodes), and the warm workers hold
    # theirs: `trainforge cluster stop` took 30 s, ended at the supervisor's timeout with
    # SIGKILL, and Ray's agents, never told to stop, lived on for minutes.
    ray_env = {**os.environ, "RAY_ADDRESS": f"127.0.0.1:{ports['gcs']}",
               "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}  # fmt: skip
    return subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        env=ray_env,
    )  # fmt: skip


def _stop_head(ray_process: subprocess.Popen[bytes]) -> None:
    if ray_process.poll() is None:
        ray_process.send_signal(signal.SIGTERM)  # `ray start --block` stops its node on SIGTERM
        try:
            ray_process.wait(timeout=RAY_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"ray did not stop within {RAY_STOP_TIMEOUT_S:.0f} s: killing it", flush=True)
            ray_process.kill()


def _relay(stream: IO[bytes], ready: threading.Event) -> None:
    """Copy `ray start`'s output to the supervisor's log; it says "Ray runtime started" once
    the head node (GCS, raylet, dashboard) is up."""
    for line in stream:
        sys.stdout.buffer.write(line)
        sys.stdout.flush()
        if b"Ray runtime started" in line:
            ready.set()


def _idle_for(lock_path: Path) -> float:
    try:
        return time.time() - lock_path.stat().st_mtime
    except OSError:
        return 0.0


def _hold_alone(lock_path: Path) -> IO[str] | None:
    """The lock file, open and locked exclusively (no command holds it), else None."""
    handle = open(lock_path, "a")  # noqa: SIM115 - returned open: closing it releases the lock
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


# --- helpers --------------------------------------------------------------------------------


def _supervisor_env() -> dict[str, str]:
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(folder() / "token"),
           **SINGLE_NODE}  # fmt: skip
    # MLflow's settings are each command's (its store, its credentials): every command hands
    # its own to the workers (worker_env); the cluster's own would outlive the command that
    # started it, and be seen by later commands that set none
    for key in [k for k in env if k.startswith("MLFLOW_")] + ["RAY_ADDRESS", "RAY_AUTH_TOKEN"]:
        env.pop(key, None)
    env.setdefault("OMP_NUM_THREADS", "1")
    # Ray Train's settings for every run on this cluster: its controller reads them from its own
    # environment, which is the cluster's.
    env |= RUN_SETTINGS
    return env


SINGLE_NODE = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""Ray's single-node mode, where every port of the cluster is bound to 127.0.0.1. Otherwise Ray
2.60 takes ``--node-ip-address=127.0.0.1`` for the machine's own address (its
``resolve_ip_for_localhost``): the GCS, raylet, agents and workers listen on all interfaces
and its client server on the machine's address. Every process that talks to the cluster needs
it too, else it too turns 127.0.0.1 into that address, where nothing listens
(``single_node_client``); the cluster's own processes inherit it."""


def single_node_client() -> None:
    """Let this process join the lasting cluster at 127.0.0.1 (``SINGLE_NODE``). Ray reads the
    variable when it is imported, which a command has done before it knows where it runs, and
    asks the constant each time it resolves an address."""
    os.environ.update(SINGLE_NODE)
    constants = sys.modules.get("ray._private.ray_constants")
    if constants is not None:
        constants.ENABLE_RAY_CLUSTER = False  # type: ignore[attr-defined]


RUN_SETTINGS = {
    # ray.train.report waits for the controller's next poll (2 s by default)
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
    # an extra actor process per run; one machine has no node to be preempted
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
}


def _wait_for_state(home: Path, supervisor: subprocess.Popen[bytes]) -> ClusterState | None:
    """The cluster's state once published; None when the supervisor ended without publishing
    it (Ray did not start: a port chosen free was taken before Ray bound it, as another Ray
    starting on the machine can do)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        state = read_state()
        if state is not None:
            return state
        if supervisor.poll() is not None:
            return read_state()
        time.sleep(0.2)
    raise RuntimeError(
        f"the local Ray cluster did not come up within {START_TIMEOUT_S:.0f} s; "
        f"see {home / 'supervisor.log'}"
    )


@contextlib.contextmanager
def _start_lock(home: Path) -> Any:
    handle: IO[str]
    with open(home / "start.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)  # two commands starting at once start one cluster
        yield


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    os.replace(tmp, path)


def usable_cpus() -> int | None:
    """The CPUs this process may run on, where that is fewer than Ray would count (None: Ray's
    own count stands). Ray counts the machine's cores, or a container's CPU quota, but not the
    CPUs a process is confined to: a SLURM job's cpuset, ``taskset``, a container pinned to a
    few cores of a large host. Ray would then run as many tasks at once as the machine has
    cores, on those few."""
    try:
        allowed = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return None
    if allowed >= (os.cpu_count() or allowed):
        return None
    try:  # Ray's own count: the machine's, or a container's CPU quota
        from ray._private.utils import get_num_cpus
    except ImportError:  # moved in another Ray: the affinity alone
        return allowed
    return allowed if allowed < get_num_cpus() else None


def idle_stop_s() -> float:
    """How long the cluster waits unused before it stops (``settings.CLUSTER_IDLE_S``)."""
    return settings.CLUSTER_IDLE_S.seconds()


def _alive(pid: int) -> bool:
    if pid <= 0:  # not a process (a corrupt state): 0 and -1 would name process groups
        return False
    with contextlib.suppress(ChildProcessError):  # not our child: kill(0) below tells
        if os.waitpid(pid, os.WNOHANG)[0] == pid:  # our child that exited (a zombie): reaped
            return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: not ours to use
        return False
    return not orphans.zombie(pid)


def _port_open(host: str, port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1.0)
        return probe.connect_ex((host, port)) == 0


def free_port() -> int:
    """A port free on loopback now (the caller binds it soon after)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _python() -> str:
    return os.path.realpath(sys.executable)


def _ray_version() -> str:
    from importlib.metadata import version

    return version("ray")


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m trainforge.driver.local_cluster")
    parser.add_argument("--idle-stop", type=float, default=float(settings.CLUSTER_IDLE_S.default))
    parser.add_argument("--num-cpus", type=int)
    args = parser.parse_args(argv)
    return supervise(args.idle_stop, args.num_cpus)


if __name__ == "__main__":
    sys.exit(main())
