"""deploy/slurm/trainforge.sbatch: shellcheck-clean, fails fast and clearly, and — with stand-ins
for ``srun`` and ``scontrol`` — brings up a real two-node Ray cluster on this machine, trains
through it and takes it down again.

The stand-in ``srun`` runs its command here, except ``ray stop``, which it only records: that
command kills every Ray process on the machine, other test sessions' too. The run's own
processes carry a marker in their environment; the test finds them by it and kills only those.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "deploy" / "slurm" / "trainforge.sbatch"
DIGITS = ROOT / "recipes" / "cnn" / "digits_simple_cnn.yaml"
MARKER = "TRAINFORGE_SLURM_TEST_ID"

SRUN = r"""#!/bin/bash
# srun stand-in: record the call, drop SLURM's options, run the command on this machine.
nodes=
while (($#)); do
    case $1 in
    -w | --nodelist) nodes=$2 && shift 2 ;;
    --nodelist=*) nodes=${1#*=} && shift ;;
    -N | -n | -c | --nodes | --ntasks | --ntasks-per-node | --cpus-per-task) shift 2 ;;
    --*=* | --overlap | --exact) shift ;;
    -*) echo "srun stand-in: unknown option $1" >&2 && exit 2 ;;
    *) break ;;
    esac
done
echo "$nodes: $*" >>"$SRUN_LOG"
# `ray stop` would end every Ray process on this machine, not only this job's: record it only.
[[ "$1 $2" == "ray stop" ]] && exit 0
exec "$@"
"""

SCONTROL = r"""#!/bin/bash
[[ "$1 $2" == "show hostnames" ]] || { echo "scontrol stand-in: $*" >&2; exit 2; }
tr , '\n' <<<"$3"
"""

# For the fail-fast tests: a `ray` whose nodes die at once (`dies`) or never answer (`hangs`).
FAKE_RAY = r"""#!/bin/bash
case $1 in
start) [[ $FAKE_RAY == hangs ]] && exec sleep 300; echo "fake ray: cannot start" >&2; exit 1 ;;
status) exit 1 ;;
*) exit 0 ;;
esac
"""


def _write_tools(bin_dir: Path, fake_ray: bool = False) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    tools = {"srun": SRUN, "scontrol": SCONTROL} | ({"ray": FAKE_RAY} if fake_ray else {})
    for name, text in tools.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)


def _free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    try:
        for s in sockets:
            s.bind(("", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _env(bin_dir: Path, srun_log: Path, marker: str, **extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("SLURM_", "TRAINFORGE_", "RAY_AUTH_")) and k != "RAY_ADDRESS"
    }
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env['PATH']}",
        SRUN_LOG=str(srun_log),
        SLURM_JOB_ID="4242",
        SLURM_JOB_NODELIST="node-a,node-b",
        SLURM_CPUS_PER_TASK="1",
        OMP_NUM_THREADS="1",
        MLFLOW_DISABLE_TELEMETRY="true",
        **{MARKER: marker},
    )
    env.update(extra)
    return env


def _marked(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(MARKER) == marker:
                found.append(proc)
        except psutil.Error:
            pass
    return found


def _wait_gone(marker: str, timeout_s: float) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout_s
    while (left := _marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


def _kill_marked(marker: str) -> None:
    """Stop what this test started, whatever state the script left it in (not `ray stop`: that
    would stop every Ray on the machine)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for proc in _marked(marker):
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)
        if not _wait_gone(marker, 10):
            return


def _describe(procs: list[psutil.Process]) -> list[str]:
    out = []
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            out.append(f"{proc.pid} {' '.join(proc.cmdline())[:120]}")
    return out


def test_shellcheck_clean() -> None:
    shellcheck = shutil.which("shellcheck")
    assert shellcheck, "shellcheck is missing: apt-get install -y shellcheck"
    result = subprocess.run(
        [shellcheck, "--shell=bash", str(SCRIPT)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("fake_ray", "message"),
    [
        ("dies", "a 'ray start' step ended early"),
        ("hangs", "did not answer within 3s"),
    ],
)
def test_fails_fast_and_clearly(tmp_path: Path, fake_ray: str, message: str) -> None:
    bin_dir, srun_log, marker = tmp_path / "bin", tmp_path / "srun.log", uuid.uuid4().hex
    _write_tools(bin_dir, fake_ray=True)
    env = _env(
        bin_dir,
        srun_log,
        marker,
        FAKE_RAY=fake_ray,
        RAY_AUTH_TOKEN_PATH=str(tmp_path / "auth_token"),
        TRAINFORGE_RAY_TMPDIR=str(tmp_path / "ray"),
        TRAINFORGE_START_TIMEOUT="3",
        TRAINFORGE_STOP_TIMEOUT="5",
    )
    try:
        started = time.monotonic()
        result = subprocess.run(
            ["bash", str(SCRIPT), str(DIGITS), "run.name=x"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert result.returncode == 1, result.stdout + result.stderr
        assert message in result.stderr
        assert time.monotonic() - started < 30
        assert "node-a,node-b: ray stop --force" in srun_log.read_text()
        assert not _wait_gone(marker, 5), "the hanging head step outlived the script"
    finally:
        _kill_marked(marker)


def test_usage_errors(tmp_path: Path) -> None:
    bin_dir, srun_log = tmp_path / "bin", tmp_path / "srun.log"
    _write_tools(bin_dir)
    env = _env(bin_dir, srun_log, "usage")

    def run(*args: Path) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", SCRIPT, *args], env=env, capture_output=True, text=True, timeout=30
        )

    usage = run()
    assert usage.returncode == 2 and "usage: sbatch" in usage.stderr
    del env["SLURM_JOB_NODELIST"]
    outside = run(DIGITS)
    assert outside.returncode == 1 and "submit this with sbatch" in outside.stderr
    assert not srun_log.exists()


@pytest.mark.slow
@pytest.mark.ray
def test_two_node_cluster_trains_and_stops(tmp_path: Path) -> None:
    bin_dir, srun_log, marker = tmp_path / "bin", tmp_path / "srun.log", uuid.uuid4().hex
    _write_tools(bin_dir)
    runs, token = tmp_path / "runs", tmp_path / "auth_token"
    # Ray's Unix sockets live under the temp dir: keep its path short (108-byte limit).
    ray_tmp = Path(tempfile.mkdtemp(prefix="tfslurm-", dir="/tmp"))
    head_tmp, worker_tmp = ray_tmp / "a", ray_tmp / "b"
    gcs, dashboard, client, head_agent, worker_agent = _free_ports(5)
    env = _env(
        bin_dir,
        srun_log,
        marker,
        # A token of its own: the test neither needs nor touches ~/.ray/auth_token.
        RAY_AUTH_TOKEN_PATH=str(token),
        TRAINFORGE_RAY_PORT=str(gcs),
        TRAINFORGE_DASHBOARD_PORT=str(dashboard),
        TRAINFORGE_RAY_CLIENT_PORT=str(client),
        TRAINFORGE_RAY_TMPDIR=str(head_tmp),
        TRAINFORGE_START_TIMEOUT="60",
        TRAINFORGE_STOP_TIMEOUT="20",
        # Both raylets share this machine: their own agent ports, and a temp dir of its own for
        # the second (else each node's log monitor tails the other's worker logs too), and a
        # resource that names it.
        TRAINFORGE_HEAD_START_ARGS=f"--dashboard-agent-listen-port={head_agent}",
        TRAINFORGE_WORKER_START_ARGS=(
            f"--dashboard-agent-listen-port={worker_agent} --temp-dir={worker_tmp} "
            '--resources={"node_b":1} --num-cpus=1'
        ),
    )
    overrides = [
        "run.name=slurm-test",
        "train.epochs=1",
        "tracking.enabled=false",
        f"run.storage_path={runs}",
        "scaling.num_workers=2",
        "scaling.use_all_gpus=false",
    ]
    log = tmp_path / "job.out"
    try:
        # Into a file, not a pipe: Ray processes left behind would hold a pipe open and turn a
        # leak into a timeout instead of the clear failure below.
        with log.open("w") as out:
            result = subprocess.run(
                ["bash", str(SCRIPT), str(DIGITS), *overrides],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                timeout=240,
            )
        output = log.read_text()
        assert result.returncode == 0, output[-6000:]
        assert "Ray cluster up: 2 nodes, 0 GPUs" in output, output[-6000:]
        assert sorted(runs.glob("slurm-test/checkpoint_*")), output[-6000:]

        calls = srun_log.read_text().splitlines()
        assert any(c.startswith("node-a: ray start --head") for c in calls), calls
        assert any(c.startswith("node-b: ray start --address=") for c in calls), calls
        assert "node-a,node-b: ray stop --force" in calls
        # One DDP rank ran on each raylet: each node's own log folder holds a training worker.
        for node_tmp in (head_tmp, worker_tmp):
            logs = node_tmp.glob("session_*/logs/worker-*")
            assert any("Reporting training result" in p.read_text() for p in logs), node_tmp

        assert len(token.read_text()) == 64 and token.stat().st_mode & 0o077 == 0
        # Stopped: the `ray start` steps, raylets, GCS and workers of this run are all gone.
        left = _wait_gone(marker, 15)
        assert not left, _describe(left)
    finally:
        _kill_marked(marker)
        shutil.rmtree(ray_tmp, ignore_errors=True)
