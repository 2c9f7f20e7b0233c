"""The lasting local cluster for real (``trainforge`` commands in subprocesses, each user's
home its own), and what those commands show on the console: started, reused, listening on
127.0.0.1 only, stale replaced, stopped, two homes apart, stopped when idle; only trainforge's
lines unless -v; a live bar in a terminal. Its warm workers (``driver/warm_pool.py``): started
by the first run, serving the next, restarted after a failure, stopped with an interrupted or
killed command; and Ray Train's worker group on the same cluster when they are switched off.

One test runs the steps in order in one home (steps of one test cannot land on two xdist
workers). Other tests may start a Ray beside it: the lasting cluster picks free ports, its
agents bind port 0, and a start whose port was taken meanwhile starts again on new ones."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests import faults
from tests.conftest import RECIPES

pytestmark = pytest.mark.ray

DIGITS = RECIPES / "cnn" / "digits_simple_cnn.yaml"
SBI = RECIPES / "sbi" / "two_moons_debug.yaml"
SHORT = ["train.epochs=2", "scaling.num_workers=2", "train.log_every_steps=5"]
OWN_LINE = re.compile(r"^(\[trainforge\]|trainforge: )")


# Ten steps of real commands: 160 s alone here, 701 s in one suite run on this machine at its
# slowest (every test ~2x slower that run); the default 900 s limit is for one command's worth.
@pytest.mark.timeout(1800)
def test_the_lasting_cluster_from_start_to_stop(home: Path, tmp_path: Path) -> None:
    steps = [step_the_first_command_replaces_a_stale_cluster_and_shows_only_its_own_lines,
             step_it_listens_on_loopback_only_and_status_shows_its_memory,
             step_the_next_command_reuses_it_and_a_terminal_gets_a_live_bar,
             step_warm_workers_stop_with_their_command_and_end_unused,
             step_new_workers_start_before_the_simulations_are_made,
             step_verbose_without_warm_workers_shows_ray_trains_lines,
             step_two_homes_get_two_clusters_and_an_idle_one_stops_itself,
             step_stop_ends_the_cluster_and_its_ray_processes,
             step_with_no_cluster_a_command_trains_on_its_own_processes_then_starts_one,
             step_a_killed_supervisors_ray_is_named_by_status_and_ended_by_stop,
             step_a_killed_cold_command_leaves_no_worker,
             step_a_lone_workers_tracking_is_sent_by_its_command]  # fmt: skip
    for number, step in enumerate(steps):
        folder = tmp_path / f"step{number}"
        folder.mkdir()
        began = time.monotonic()
        step(home, folder)
        print(f"{step.__name__}: {time.monotonic() - began:.1f} s")  # shown if a later step fails


def trainforge() -> list[str]:
    return [sys.executable, "-m", "trainforge"]


def env_for(home: Path, **extra: str) -> dict[str, str]:
    """A user's environment, with their own home: no cluster named, none of the test session's
    settings for Ray (conftest.py); ``extra`` on top."""
    env = dict(os.environ)
    for key in ("RAY_ADDRESS", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_MODE",
                "TRAINFORGE_WORKERS"):  # fmt: skip
        env.pop(key, None)
    return {**env, "TRAINFORGE_HOME": str(home), **extra}


def state_of(home: Path) -> dict:
    return json.loads((home / "local-cluster" / "state.json").read_text())


def alive(pid: int) -> bool:
    """Running (an exited process that nobody reaped yet is not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def run(home: Path, *args: str, cwd: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*trainforge(), *args], env=env_for(home, **extra), cwd=cwd, capture_output=True,
        text=True, timeout=400,
    )  # fmt: skip


def step_the_first_command_replaces_a_stale_cluster_and_shows_only_its_own_lines(
    home: Path, tmp_path: Path
) -> None:
    # what a session that died leaves behind: a state naming a dead supervisor and a closed port
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folder = home / "local-cluster"
    folder.mkdir(parents=True)
    (folder / "state.json").write_text(json.dumps({
        "gcs_address": "127.0.0.1:1", "dashboard_url": "http://127.0.0.1:2",
        "supervisor_pid": dead.pid, "temp_dir": "/nonexistent", "python": sys.executable,
        "ray_version": "2.60.0", "started_at": 0.0,
    }))  # fmt: skip

    # TRAINFORGE_WORKERS=warm: the command starts the cluster before its run (by default it
    # trains on processes of its own and starts it afterwards: the last steps)
    out = run(home, "train", str(DIGITS), "run.name=first", *SHORT, cwd=tmp_path,
              TRAINFORGE_WORKERS="warm")  # fmt: skip

    assert out.returncode == 0, out.stdout + out.stderr
    console = out.stdout + out.stderr
    assert f"(its supervisor (pid {dead.pid}) is gone); replacing it" in console
    state = state_of(home)
    assert f"ray: started a local cluster at {state['gcs_address']}" in console
    assert (  # what it costs, said the first time in this home
        "ray: the local cluster holds about 0.75 GB of memory, and 0.35 GB per warm worker until "
        "30 min unused or `trainforge cluster stop`; with TRAINFORGE_WORKERS=own nothing outlives "
        "a command (said once; `trainforge cluster status` shows what it holds)"
    ) in console
    assert alive(state["supervisor_pid"])
    lines = [line for line in console.splitlines() if line.strip()]
    strangers = [line for line in lines if not OWN_LINE.match(line)]
    assert strangers == [], strangers  # no Ray, Ray Train or MLflow internals
    assert "\x1b[" not in console  # no colour codes into a pipe
    for phase in ("workers: starting 2 (they stay warm for later runs)", "mlflow: run ",
                  "workers: 2 started, process group up ("):  # fmt: skip
        assert phase in console
    assert "epoch 2/2 step" in console  # plain step lines when not a terminal
    assert re.search(r"val/accuracy\s+0\.\d{4}", console)  # the closing table
    assert_worker_lines_come_before_the_table(lines, "first")
    kept = (tmp_path / "runs" / "first" / "worker-output.log").read_text()
    assert "(TrainforgeWorker rank=0 " in kept  # every worker line is kept, shown or not
    assert not list((tmp_path / "runs" / "first").glob(".worker-lines-*"))  # relayed, removed


def step_the_next_command_reuses_it_and_a_terminal_gets_a_live_bar(
    home: Path, tmp_path: Path
) -> None:
    state = state_of(home)
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [*trainforge(), "train", str(DIGITS), "run.name=second", *SHORT,
         "train.log_every_steps=2", "tracking.system_metrics_interval_s=0.5"],
        env=env_for(home), cwd=tmp_path, stdout=follower, stderr=follower,
    )  # fmt: skip
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 4096)
        except OSError:  # the terminal closed: the command ended
            break
        if not chunk:
            break
        chunks.append(chunk)
    assert process.wait(timeout=400) == 0
    console = b"".join(chunks).decode()
    assert f"ray: connected to the local cluster at {state['gcs_address']}" in console
    assert state_of(home)["supervisor_pid"] == state["supervisor_pid"]  # the same cluster
    # a terminal that reports no size (this new pseudo-terminal's is 0×0) gets a bar 80 wide
    assert "\r" in console  # the bar is redrawn in place …
    assert re.search(r"epoch 2/2 +\d+%\|[^|]*\| *44/44", console), repr(console[-2500:])
    assert "[trainforge] epoch 2/2 step" not in console  # … instead of the step lines
    assert "[trainforge] epoch 2/2 done" in console  # epoch lines still print above it
    assert "workers: 2 warm, process group up (" in console  # the first run's processes
    assert_the_warm_tracker_made_the_run(tmp_path, console, "second")

    status = run(home, "cluster", "status", cwd=tmp_path)  # what is kept warm, and its cost
    assert status.returncode == 0, status.stdout + status.stderr
    assert "[trainforge] warm workers: 2" in status.stdout
    assert "[trainforge] warm trackers: 1" in status.stdout
    assert "[trainforge] resources: " in status.stdout
    for name in ("worker-0", "worker-1", "tracker-0"):
        assert re.search(rf"  {name}: pid \d+, the CPU, [\d,]+ MB, unused for \d+ s "
                         r"\(ends after 600 s unused\)", status.stdout), status.stdout  # fmt: skip

    # The same command on the finished run: its outcome again; no worker, nothing written.
    run_dir = tmp_path / "runs" / "second"
    files = sorted(p.name for p in run_dir.iterdir())
    again = run(home, "train", str(DIGITS), "run.name=second", *SHORT, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "[trainforge] run 'second' finished earlier (" in again.stdout
    assert re.search(r"val/accuracy\s+0\.\d{4}", again.stdout)
    assert "workers:" not in again.stdout and "ray:" not in again.stdout
    assert sorted(p.name for p in run_dir.iterdir()) == files


def step_it_listens_on_loopback_only_and_status_shows_its_memory(
    home: Path, tmp_path: Path
) -> None:
    """Every socket the cluster's processes listen on — Ray's GCS, raylet, dashboard, agents,
    client server, the warm workers' and tracker's own (the first step's) — is bound to
    127.0.0.1; `cluster status` says how much memory they hold."""
    from trainforge.driver import cluster_footprint

    state = state_of(home)
    status = run(home, "cluster", "status", cwd=tmp_path)
    assert status.returncode == 0, status.stdout + status.stderr
    memory = re.search(r"\[trainforge\] memory: (\d+\.\d\d) GB \(PSS, summed over its (\d+) "
                       r"processes\)", status.stdout)  # fmt: skip
    assert memory and 0.5 < float(memory[1]) < 8 and int(memory[2]) >= 10, status.stdout
    found = cluster_footprint.processes(state["supervisor_pid"])
    listeners = cluster_footprint.listening(found)
    names = {listener.name for listener in listeners}
    assert {"gcs_server", "raylet", "ray::WarmWorker", "ray::WarmTracker"} <= names, names
    gcs_port = int(state["gcs_address"].rsplit(":", 1)[1])
    assert any(listener.port == gcs_port for listener in listeners)
    outside = [listener for listener in listeners if not listener.loopback]
    assert outside == [], outside
    # Ray's processes run in the cluster's own folder, not in the first command's, which the
    # user may delete (a process Ray started there later would have no working directory);
    # a warm worker moves to each command's folder for its run
    ray_core = [p for p in found if p.name() in ("gcs_server", "raylet") or p.pid == found[0].pid]
    assert len(ray_core) == 3
    assert {p.cwd() for p in ray_core} == {str(home / "local-cluster")}


def step_warm_workers_stop_with_their_command_and_end_unused(home: Path, tmp_path: Path) -> None:
    """A SIGKILLed command cannot stop its warm workers: each stops its loop itself (it checks
    that its command lives). A restart after a failure and a Ctrl-C, on every worker group:
    tests/integration/test_worker_groups.py."""
    process, _ = training(home, tmp_path, "stopped")
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    deadline = time.monotonic() + 20
    while warm_workers(home, ".run") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert warm_workers(home, ".run") == []

    # Unused for TRAINFORGE_WARM_IDLE_S, warm workers end: their memory goes back.
    brief = run(home, "train", str(DIGITS), "run.name=brief", "train.epochs=1",
                "scaling.num_workers=2", cwd=tmp_path, TRAINFORGE_WARM_IDLE_S="3")  # fmt: skip
    assert brief.returncode == 0, brief.stdout + brief.stderr
    deadline = time.monotonic() + 20
    assert warm_workers(home) != []  # it has workers, idle now …
    while warm_workers(home) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert warm_workers(home) == []  # … and then none


def training(home: Path, cwd: Path, name: str) -> tuple[subprocess.Popen[str], list[str]]:
    """A long digits run, started and read until it has trained an epoch (a resumed run: a
    later one); the process, its stdout still open, and the lines it printed so far."""
    long = [*trainforge(), "train", str(DIGITS), f"run.name={name}", "train.epochs=200",
            "scaling.num_workers=2", "train.log_every_steps=5"]  # fmt: skip
    process = subprocess.Popen(long, env=env_for(home), cwd=cwd, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    assert process.stdout is not None
    seen = []
    for line in process.stdout:
        seen.append(line)
        if re.search(r"epoch \d+/200 done", line):
            break
    return process, seen


def warm_workers(home: Path, doing: str = "", kind: str = "WarmWorker") -> list[str]:
    """This home's cluster's warm worker processes (doing ``.run``: running a loop; ``kind``
    ``WarmSimulator``: its warm simulators). Ray titles an actor's process after its class and
    the method it runs; the process is a child of the cluster's raylet, whose arguments name
    the cluster's temp dir."""
    temp_dir = state_of(home)["temp_dir"]
    ps = subprocess.run(["ps", "-ww", "-eo", "pid=,ppid=,args="], capture_output=True,
                        text=True)  # fmt: skip  # -ww: whole lines, whatever COLUMNS says
    table = {}
    for line in ps.stdout.splitlines():
        pid, ppid, args = line.split(None, 2)
        table[pid] = (ppid, args)

    def of_this_cluster(pid: str) -> bool:
        for _ in range(6):  # the raylet is the worker's parent; a few levels, to be safe
            pid = table.get(pid, ("", ""))[0]
            if temp_dir in table.get(pid, ("", ""))[1]:
                return True
        return False

    return [args for pid, (_, args) in table.items()
            if args.startswith(f"ray::{kind}{doing}") and of_this_cluster(pid)]  # fmt: skip


def processes_of(gcs_address: str) -> list[str]:
    """Living processes started by the cluster at ``gcs_address`` (its supervisor gives Ray's
    processes RAY_ADDRESS), named by their titles."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or not alive(int(proc.name)):
            continue
        try:
            environ = (proc / "environ").read_bytes().split(b"\0")
            title = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # ended meanwhile, or not ours
            continue
        if f"RAY_ADDRESS={gcs_address}".encode() in environ:
            found.append(title.strip())
    return found


def step_new_workers_start_before_the_simulations_are_made(home: Path, tmp_path: Path) -> None:
    """With no warm worker left (the step before), an SBI command starts its workers before
    its simulation stage, so their imports overlap it, and its run takes them."""
    assert warm_workers(home) == []
    out = run(home, "train", str(SBI), "run.name=sbi", "train.epochs=1",
              "workload.simulation.num_simulations=4000", "workload.evaluation.observations=[]",
              "workload.evaluation.sbc_runs=0", cwd=tmp_path)  # fmt: skip

    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    starting = lines.index("[trainforge] workers: starting 2 (they stay warm for later runs)")
    simulating = next(i for i, line in enumerate(lines) if "] simulations: " in line)
    assert starting < simulating, out.stdout
    assert out.stdout.count("workers: starting") == 1  # the run took those two
    assert "workers: 2 started, process group up (" in out.stdout
    assert "evaluation:" not in out.stdout  # nothing was asked of it: no empty line
    assert len(warm_workers(home)) == 2


def step_verbose_without_warm_workers_shows_ray_trains_lines(home: Path, tmp_path: Path) -> None:
    out = run(home, "train", "-v", str(DIGITS), "run.name=loud", *SHORT, cwd=tmp_path,
              TRAINFORGE_WORKERS="ray-train")  # fmt: skip

    assert out.returncode == 0, out.stderr
    console = out.stdout + out.stderr
    assert "(RayTrainWorker pid=" in console  # Ray Train's worker group, on the same cluster
    assert "Connected to Ray cluster" in console
    assert "workers: 2 started, process group up (" in console


def step_two_homes_get_two_clusters_and_an_idle_one_stops_itself(
    home: Path, tmp_path: Path
) -> None:
    first = state_of(home)
    other = tmp_path / "other-user"
    started = run(other, "cluster", "start", cwd=tmp_path, TRAINFORGE_CLUSTER_IDLE_S="2")
    assert started.returncode == 0, started.stderr
    second = state_of(other)
    # a look while it is about to stop itself: it waits for the look to end, or the look
    # finds it gone (it once connected to the stopping Ray and waited a minute for its GCS)
    looked_at = time.monotonic()
    status = run(other, "cluster", "status", cwd=tmp_path)
    assert time.monotonic() - looked_at < 20
    assert ("resources: " in status.stdout) == (status.returncode == 0), status.stdout
    assert second["gcs_address"] != first["gcs_address"]
    tokens = [(h / "local-cluster" / "token").read_text() for h in (home, other)]
    assert tokens[0] != tokens[1]
    assert oct((other / "local-cluster" / "token").stat().st_mode & 0o777) == "0o600"

    deadline = time.monotonic() + 60  # idle 2 s, checked every 0.5 s
    while alive(second["supervisor_pid"]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not alive(second["supervisor_pid"])
    assert not (other / "local-cluster" / "state.json").exists()
    assert alive(first["supervisor_pid"])  # the first home's cluster is untouched
    status = run(home, "cluster", "status", cwd=tmp_path)
    assert status.returncode == 0 and first["gcs_address"] in status.stdout

    # A cluster started by a command confined to one of the machine's CPUs (a SLURM job's
    # cpuset, `taskset`) is told that one: Ray counts the machine's cores.
    confined = tmp_path / "confined-user"
    one_cpu = {min(os.sched_getaffinity(0))}
    started = subprocess.run(
        [*trainforge(), "cluster", "start"], env=env_for(confined), cwd=tmp_path,
        capture_output=True, text=True, timeout=120,
        preexec_fn=lambda: os.sched_setaffinity(0, one_cpu),
    )  # fmt: skip
    try:
        assert started.returncode == 0, started.stderr
        status = run(confined, "cluster", "status", cwd=tmp_path)
        assert "[trainforge] resources: 1 CPU, 0 GPUs" in status.stdout, status.stdout
    finally:
        run(confined, "cluster", "stop", cwd=tmp_path)


def step_stop_ends_the_cluster_and_its_ray_processes(home: Path, tmp_path: Path) -> None:
    """With warm workers holding their leases (Ray 2.60's `ray start --block` would wait 30 s
    for them on SIGTERM unless told not to drain), Ray stops when asked, every process of the
    cluster with it (its agents too: their titles do not name the cluster; their environment
    does)."""
    state = state_of(home)
    assert len(warm_workers(home)) == 2  # from the SBI step: leases held
    stopped = run(home, "cluster", "stop", cwd=tmp_path)

    assert stopped.returncode == 0 and "local cluster stopped" in stopped.stdout
    assert not alive(state["supervisor_pid"])
    supervisor_log = (home / "local-cluster" / "supervisor.log").read_text()
    assert "ray did not stop within" not in supervisor_log  # stopped by SIGTERM, not killed
    ps = subprocess.run(["ps", "-ww", "-eo", "args"], capture_output=True, text=True).stdout
    assert state["temp_dir"] not in ps  # no raylet or GCS of that cluster is left
    deadline = time.monotonic() + 10
    while processes_of(state["gcs_address"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_of(state["gcs_address"]) == []
    status = run(home, "cluster", "status", cwd=tmp_path)
    assert status.returncode == 1 and "no local cluster is running" in status.stdout


def step_with_no_cluster_a_command_trains_on_its_own_processes_then_starts_one(
    home: Path, tmp_path: Path
) -> None:
    """No cluster runs (the step before stopped it): the command trains on processes of its
    own and starts the cluster and its warm workers in the background as it ends; the next
    command finds both. The command makes the MLflow run beside its workers, which never wait
    for it, and sends what rank 0 writes (its imports are listed: -X importtime). The
    background's rehearsal runs without the command's worker plugin (a test's fault)."""
    # its store named in the environment (the cluster it starts inherits that environment)
    store = f"sqlite:///{tmp_path / 'mlflow.db'}"
    out = run(home, "train", str(DIGITS), "run.name=own", *SHORT, cwd=tmp_path,
              PYTHONPROFILEIMPORTTIME="1", MLFLOW_TRACKING_URI=store,
              **faults.env({}, **{faults.FAIL_AFTER_EPOCH: 9}))  # fmt: skip

    assert out.returncode == 0, out.stdout + out.stderr
    imports = [line for line in out.stderr.splitlines() if line.startswith("import time:")]
    stderr = "\n".join(line for line in out.stderr.splitlines() if line not in imports)
    console = out.stdout + stderr
    command_imported_mlflow = any(line.split("|")[-1].strip() == "mlflow" for line in imports)
    assert command_imported_mlflow, "\n".join(imports[-5:])
    with sqlite3.connect(tmp_path / "mlflow.db") as db:  # created, then ended, by the command
        (status,) = db.execute("SELECT status FROM runs WHERE name = 'own'").fetchone()
    assert status == "FINISHED"
    lines = [line for line in console.splitlines() if line.strip()]
    strangers = [line for line in lines if not OWN_LINE.match(line)]
    assert strangers == [], strangers
    phases = ("ray: no local cluster runs; this run's workers are processes of this command",
              "workers: starting 2, processes of this command", "mlflow: run ",
              "workers: 2 started, process group up (", "epoch 2/2 done",
              "ray: starting the local cluster and 2 warm workers in the background")  # fmt: skip
    for phase in phases:
        assert phase in console, phase
    assert re.search(r"val/accuracy\s+0\.\d{4}", console)  # the closing table
    assert_worker_lines_come_before_the_table(lines, "own")
    assert "ray: connected" not in console and "ray: started" not in console  # no Ray waited for
    assert "ray: the local cluster holds" not in console  # said once in this home: the first step
    run_dir = tmp_path / "runs" / "own"
    assert list(run_dir.glob("checkpoint_*"))
    assert "(TrainforgeWorker rank=0 " in (run_dir / "worker-output.log").read_text()
    assert not list(run_dir.glob(".worker-lines-*"))

    # the background start takes Ray's start and a rehearsal (tens of seconds): `cluster
    # start` waits for its cluster (it used to say it started one), status says what is left
    started = run(home, "cluster", "start", cwd=tmp_path)
    assert started.returncode == 0, started.stdout + started.stderr
    assert started.stdout.startswith(
        "[trainforge] a background start of the local cluster is under way: waiting for its "
        "cluster\n[trainforge] local cluster at 127.0.0.1:"
    ), started.stdout
    status = run(home, "cluster", "status", cwd=tmp_path).stdout
    assert "a background start is still readying warm workers" in status, status
    assert f"local cluster at {state_of(home)['gcs_address']}" in started.stdout
    wait = "from trainforge.driver import background; assert background.wait(240)"
    waited = subprocess.run([sys.executable, "-c", wait], env=env_for(home), timeout=300)
    assert waited.returncode == 0
    assert alive(state_of(home)["supervisor_pid"])
    assert len(warm_workers(home)) == 2
    # their first run, a rehearsal, is made in the background, without the command's fault
    background = (home / "local-cluster" / "background.log").read_text()
    assert "rehearsal done" in background, background

    # the next command, from another project's folder, with no store named: its run is in that
    # folder's store (the workers of the cluster the command above started once took that
    # command's store from their environment)
    elsewhere = tmp_path / "another-project"
    elsewhere.mkdir()
    again = run(home, "train", str(DIGITS), "run.name=own-again", *SHORT, cwd=elsewhere)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"ray: connected to the local cluster at {state_of(home)['gcs_address']}" in again.stdout
    assert "workers: 2 warm, process group up (" in again.stdout  # the background's workers
    assert f"created at sqlite:///{elsewhere / 'mlflow.db'}" in again.stdout, again.stdout
    with sqlite3.connect(elsewhere / "mlflow.db") as db:
        assert db.execute("SELECT status FROM runs WHERE name = 'own-again'").fetchall() == [
            ("FINISHED",)
        ]
    # a cluster's CPUs are set at its start: asked for others, `cluster start` says so
    cpus = int(re.search(r"resources: (\d+) CPU", status)[1])
    other = run(home, "cluster", "start", f"--num-cpus={cpus + 1}", cwd=tmp_path)
    assert other.returncode == 1 and other.stdout == (
        f"[trainforge] a local cluster runs already at {state_of(home)['gcs_address']} with "
        f"{cpus} CPU{'s' * (cpus != 1)}, not the {cpus + 1} asked for: `trainforge cluster "
        f"stop` first to start one with {cpus + 1}\n"
    ), other.stdout + other.stderr
    # the rehearsal is no run of the user's: not in the MLflow store the commands use
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        names = {name for (name,) in db.execute("SELECT name FROM runs")}
    assert "own" in names and "own-again" not in names and "rehearsal" not in names, names


def step_a_killed_supervisors_ray_is_named_by_status_and_ended_by_stop(
    home: Path, tmp_path: Path
) -> None:
    """`kill -9` of the supervisor leaves its Ray running (GCS, raylet, agents, the warm
    workers of the step before): `cluster status` says so and names the way out, and `cluster
    stop` ends every process of it."""
    state = state_of(home)
    assert len(warm_workers(home)) == 2 and processes_of(state["gcs_address"])
    os.kill(state["supervisor_pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(state["supervisor_pid"]) and time.monotonic() < deadline:
        time.sleep(0.1)
    status = run(home, "cluster", "status", cwd=tmp_path)
    assert status.returncode == 1, status.stdout + status.stderr
    assert re.match(
        rf"\[trainforge\] the local cluster at {state['gcs_address']} is unusable \(its "
        rf"supervisor \(pid {state['supervisor_pid']}\) is gone\), but \d+ processes of its "
        r"Ray still run \(pids [\d …]+\): `trainforge cluster stop` ends them",
        status.stdout,
    ), status.stdout
    stopped = run(home, "cluster", "stop", cwd=tmp_path)
    assert stopped.returncode == 0 and "local cluster stopped" in stopped.stdout, stopped.stdout
    deadline = time.monotonic() + 10
    while processes_of(state["gcs_address"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert processes_of(state["gcs_address"]) == []
    assert not (home / "local-cluster" / "state.json").exists()


def step_a_killed_cold_command_leaves_no_worker(home: Path, tmp_path: Path) -> None:
    """A SIGKILLed command cannot stop its own workers: each ends itself (it checks that its
    command lives), and the killed command starts no cluster. (A Ctrl-C:
    tests/integration/test_worker_groups.py.)"""
    stopped = run(home, "cluster", "stop", cwd=tmp_path)
    assert stopped.returncode == 0
    process, seen = training(home, tmp_path, "killed")
    assert any("processes of this command" in line for line in seen), "".join(seen)
    assert own_workers_in(tmp_path) != []
    process.send_signal(signal.SIGKILL)
    process.communicate(timeout=60)
    deadline = time.monotonic() + 20
    while own_workers_in(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert own_workers_in(tmp_path) == []
    assert not (home / "local-cluster" / "state.json").exists()


def assert_the_warm_tracker_made_the_run(folder: Path, console: str, name: str) -> None:
    """A warm command's MLflow run, made and ended by the warm tracker, is as whole as a
    command's own (``step_a_lone_workers_tracking_is_sent_by_its_command``), its lines shown
    by the command, its console file removed."""
    from mlflow.tracking import MlflowClient

    assert re.search(r"\[trainforge\] mlflow: run [0-9a-f]{32} created at sqlite:", console)
    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    (found,) = client.search_runs(
        [client.get_experiment_by_name("trainforge").experiment_id],
        f"tags.`trainforge.run_name` = '{name}'",
    )
    assert found.info.status == "FINISHED"
    assert [m.value for m in client.get_metric_history(found.info.run_id, "epoch")] == [1, 2]
    assert found.data.tags["mlflow.source.name"] == str(DIGITS)  # the command's, not the tracker's
    assert any(key.startswith("system/node_0/") for key in found.data.metrics)
    assert {"model_state", "plots", "recipe.yaml"} <= {
        a.path for a in client.list_artifacts(found.info.run_id)
    }
    models = client.search_logged_models([found.info.experiment_id])
    assert found.info.run_id in [m.source_run_id for m in models]
    assert not list((folder / "runs" / name).glob(".*-lines-*"))


def step_a_lone_workers_tracking_is_sent_by_its_command(home: Path, tmp_path: Path) -> None:
    """With a core beside its one worker, the command makes the run's MLflow calls and sends
    what rank 0 writes to the run folder (``tracking/relay.py``), and samples the system: the
    run is whole, and nothing of the relay stays in the run folder. Then `cluster start
    --num-cpus 1` ends the background start the command made and starts a cluster of 1 CPU."""
    from mlflow.tracking import MlflowClient

    out = run(home, "train", str(DIGITS), "run.name=lone", "train.epochs=2",
              "scaling.num_workers=1", "tracking.system_metrics_interval_s=0.5",
              cwd=tmp_path)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "workers: starting 1, processes of this command" in out.stdout
    lines = [line for line in (out.stdout + out.stderr).splitlines() if line.strip()]
    strangers = [line for line in lines if not OWN_LINE.match(line)]
    assert strangers == [], strangers  # nothing of MLflow's model logging in the command
    assert_worker_lines_come_before_the_table(lines, "lone")
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (found,) = client.search_runs(
        [client.get_experiment_by_name("trainforge").experiment_id],
        "tags.`trainforge.run_name` = 'lone'",
    )
    run_id, data = found.info.run_id, found.data
    assert found.info.status == "FINISHED"
    assert [m.value for m in client.get_metric_history(run_id, "epoch")] == [1.0, 2.0]
    assert len(client.get_metric_history(run_id, "train/loss")) >= 4
    assert data.tags["world_size"] == "1" and "trainforge.last_checkpoint" in data.tags
    assert [i.dataset.name for i in found.inputs.dataset_inputs] == ["digits"]
    artifacts = {a.path for a in client.list_artifacts(run_id)}
    assert {"model_state", "plots", "recipe.yaml"} <= artifacts
    assert any(key.startswith("system/node_0/") for key in data.metrics), sorted(data.metrics)
    # the model, handed over by rank 0 and logged by the command
    models = client.search_logged_models([found.info.experiment_id])
    assert [m.source_run_id for m in models] == [run_id]
    run_dir = tmp_path / "runs" / "lone"
    assert [p.name for p in run_dir.iterdir() if p.name.startswith("tracking-")] == []

    # A start of one CPU while the command's background start is at work (Ray's start, the
    # workers, the rehearsal: tens of seconds) ends that start and the cluster it made, as
    # `cluster stop` does (tests/unit/test_own_workers.py), then starts the one asked for:
    # nothing of the background's comes up after it. Asked once the start says it began
    # (before, a SIGTERM ends its Python as it imports).
    log_path = home / "local-cluster" / "background.log"
    pid = (home / "local-cluster" / "background.lock").read_text().strip()
    began = f"background start (pid {pid})"
    deadline = time.monotonic() + 60
    while began not in log_path.read_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    started = run(home, "cluster", "start", "--num-cpus", "1", cwd=tmp_path)
    assert started.returncode == 0, started.stdout + started.stderr
    assert started.stdout.startswith(
        "[trainforge] a background start of the local cluster is under way: ending it first, "
        "to start one with 1 CPU\n[trainforge] local cluster started at "
    ), started.stdout
    background = log_path.read_text().rsplit(began, 1)[-1]  # this start's lines
    assert "background start ended by `trainforge cluster stop`" in background, background
    # what it had started of Ray is gone (nothing, where it was ended while it still waited
    # for a command on processes of its own to finish: background.py)
    for address in re.findall(r"ray: started a local cluster at (\S+) \(", background):
        deadline = time.monotonic() + 10
        while processes_of(address) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert processes_of(address) == []
        assert state_of(home)["gcs_address"] != address
    status = run(home, "cluster", "status", cwd=tmp_path)
    assert "[trainforge] resources: 1 CPU, 0 GPUs" in status.stdout, status.stdout
    assert "a background start" not in status.stdout
    stopped = run(home, "cluster", "stop", cwd=tmp_path)
    assert stopped.stdout == "[trainforge] local cluster stopped\n", stopped.stdout
    assert not (home / "local-cluster" / "state.json").exists()


def test_with_no_cluster_kept_a_command_trains_on_its_own_processes_and_leaves_nothing(
    home: Path, tmp_path: Path
) -> None:
    """TRAINFORGE_WORKERS=own: a command that needs no Ray starts none (it once started a
    private Ray and Ray Train's workers: 38 s of the 2-epoch digits command here, against 9 s),
    trains on processes of its own, and starts no cluster as it ends: nothing of it runs
    afterwards, nothing of a cluster is in its home."""
    out = run(home, "train", str(DIGITS), "run.name=kept-none", *SHORT, cwd=tmp_path,
              TRAINFORGE_WORKERS="own")  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    console = out.stdout + out.stderr
    assert (
        "[trainforge] ray: none for this command (TRAINFORGE_WORKERS=own: nothing "
        "outlives it); this run's workers are processes of this command"
    ) in console
    assert "workers: 2 started, process group up (" in console
    assert re.search(r"val/accuracy\s+0\.\d{4}", console)  # trained: the closing table
    assert "ray: start" not in console and "background" not in console, console
    with sqlite3.connect(tmp_path / "mlflow.db") as db:
        (status,) = db.execute("SELECT status FROM runs WHERE name = 'kept-none'").fetchone()
    assert status == "FINISHED"
    cluster = home / "local-cluster"
    assert not (cluster / "state.json").exists() and not (cluster / "background.log").exists()
    deadline = time.monotonic() + 10  # its workers end with it
    while own_workers_in(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert own_workers_in(tmp_path) == []
    made_by_it = [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
                  if f"TRAINFORGE_HOME={home}".encode() in environ_of(pid)]  # fmt: skip
    assert made_by_it == []  # no Ray process either: each would carry the command's home


def environ_of(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # ended meanwhile, or not ours to read
        return b""


def assert_worker_lines_come_before_the_table(lines: list[str], run_name: str) -> None:
    """Rank 0's last line (``finished at step``; an SBI run's evaluation after it) is shown
    before the command's closing table, which it once followed: the workers' lines come
    through a file read every 0.1 s."""
    last_worker_line = max(i for i, line in enumerate(lines) if "] finished at step " in line)
    table = next(i for i, line in enumerate(lines) if f"run '{run_name}' finished in " in line)
    assert last_worker_line < table, lines[last_worker_line - 2 :]


def own_workers_in(folder: Path) -> list[int]:
    """The cold commands' worker processes (``worker/own.py``) working in ``folder``."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            if b"trainforge.worker.own" in args and (entry / "cwd").resolve() == folder.resolve():
                found.append(int(entry.name))
        except (OSError, ValueError):
            continue
    return found
