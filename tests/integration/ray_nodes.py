"""Real Ray clusters for the deploy tests: `ray start --head` and extra `ray start --address`
nodes on this one machine, each a `--block` process stopped by the test (never a global
`ray stop`, which would also stop the test session's own Ray).

Each cluster has a temp dir of its own. Ray's job supervisor gives a job's driver the address
in `<temp dir>/ray_current_cluster`, which the last `ray start` sharing that dir wrote: with
/tmp/ray shared, a job of one test was sent to another test's cluster (seen in the suite:
"InvalidAuthToken", then that cluster's GCS gone)."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.integration.mlflow_server import free_port


class RayNodes:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.processes: list[subprocess.Popen] = []
        self.starting_log: Path | None = None  # the log of the `ray start` being waited for
        self.gcs_port = free_port()
        self.dashboard_port = free_port()
        # Ray >= 2.60 heads use token auth; each cluster here gets a token of its own, so it
        # neither needs nor touches ~/.ray/auth_token (a head refuses to start without a token).
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "OMP_NUM_THREADS": "1",
                    "RAY_AUTH_TOKEN": secrets.token_hex(32),
                    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "2"}  # fmt: skip
        self.env.pop("RAY_ADDRESS", None)
        # short: Ray's socket paths under it are limited to ~107 characters
        self.temp_dir = Path(tempfile.mkdtemp(prefix="tf-ray-", dir="/tmp"))

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def gcs(self) -> str:
        return f"127.0.0.1:{self.gcs_port}"

    def start_head(self, *args: str, attempts: int = 3, wait_for_jobs: bool = True) -> RayNodes:
        """The head, up with its job agent (unless not ``wait_for_jobs``: a cluster that
        commands join by address takes no job). Its ports are picked free but bound later, by
        processes Ray starts: another process may take one first (seen in CI: "Address
        already in use" for the client server), and then the head starts again on new ports.
        So does a head whose raylet did not register within Ray's fixed 30 s (a loaded 2-core
        machine running the suite's other Ray tests beside it)."""
        for attempt in range(1, attempts + 1):
            self._start(
                ["ray", "start", "--head", "--block", f"--port={self.gcs_port}",
                 "--dashboard-host=127.0.0.1", f"--dashboard-port={self.dashboard_port}",
                 "--ray-client-server-port", str(free_port()), f"--temp-dir={self.temp_dir}",
                 *self._agent_ports(), *args],
                "head",
            )  # fmt: skip
            try:
                self._wait(lambda: self._status_ok(), "the Ray head")
                try:
                    if wait_for_jobs:
                        self._wait(self._job_agent_ready, "the head's job agent")
                except TimeoutError as timeout:
                    raise TimeoutError(f"{timeout}; {self._agent_errors()}") from None
                return self
            except RuntimeError:
                self.stop()
                if attempt == attempts or not self._may_start_again():
                    raise
                self.processes.clear()
                self.gcs_port, self.dashboard_port = free_port(), free_port()
            except BaseException:
                self.stop()
                raise
        raise AssertionError("unreachable")

    def _may_start_again(self) -> bool:
        text = self._starting_text()
        lost_a_port = "Address already in use" in text or "Failed to bind" in text
        return lost_a_port or self._gave_up()

    @staticmethod
    def _agent_ports() -> list[str]:
        # Each raylet's agents default to fixed ports (52365 …), which a second Ray on this
        # machine (the test session's own) holds. Port 0 lets each agent bind a free one and
        # publish it; a port picked free here may be taken before the agent binds it, and an
        # agent whose HTTP server cannot bind stays alive without registering: the job agent
        # never came up (a CI run: "did not come up within 120 s").
        return ["--dashboard-agent-listen-port=0", "--dashboard-agent-grpc-port=0",
                "--runtime-env-agent-port=0", "--metrics-export-port=0"]  # fmt: skip

    def add_node(self, *args: str, attempts: int = 3) -> None:
        """A worker node. Its raylet has the same fixed 30 s to register as the head's (seen
        in CI: the node's `ray start` exited with "timed out during startup"), and its agents'
        ports may be taken first: then it starts again, once the failed one has left."""
        before = self.node_count()
        for attempt in range(1, attempts + 1):
            self._start(
                ["ray", "start", "--block", f"--address={self.gcs}", f"--temp-dir={self.temp_dir}",
                 *self._agent_ports(), *args],
                "node",
            )  # fmt: skip
            try:
                self._wait(lambda: self.node_count() > before, "the second Ray node")
                return
            except RuntimeError:
                if attempt == attempts or not self._may_start_again():
                    raise
                failed = self.processes.pop()
                self.starting_log = None  # its exit is waited for next, not its start
                self._end(failed)
                # Its raylet may have registered late: wait until the head has let it go, so
                # that the next attempt is not counted by it.
                self._wait(lambda: self.node_count() <= before, "the failed node's exit")
        raise AssertionError("unreachable")

    def node_count(self) -> int:
        out = subprocess.run(
            ["ray", "status", f"--address={self.gcs}"], env=self.env, capture_output=True,
            text=True, timeout=60,
        )  # fmt: skip
        active = out.stdout.split("Active:", 1)[-1].split("Pending:", 1)[0]
        return sum(1 for line in active.splitlines() if "node_" in line)

    def stop(self) -> None:
        for process in reversed(self.processes):
            self._signal(process, signal.SIGTERM)
        for process in self.processes:
            self._reap(process)
        shutil.rmtree(self.temp_dir, ignore_errors=True)  # a head started again makes it anew

    @staticmethod
    def _signal(process: subprocess.Popen, signum: int) -> None:
        # The group outlives its leader: a failed `ray start` may leave its raylet behind.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signum)

    def _end(self, process: subprocess.Popen) -> None:
        self._signal(process, signal.SIGTERM)
        self._reap(process)

    def _reap(self, process: subprocess.Popen) -> None:
        """Wait for a signalled process; its group is killed if it takes longer than 30 s."""
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self._signal(process, signal.SIGKILL)
            process.wait()

    def _status_ok(self) -> bool:
        return self.node_count() >= 1

    def _job_agent_ready(self) -> bool:
        """The dashboard answers before its job agent registers (slow on a loaded machine); a
        submission before then fails with "No available agent". Probe with a no-op job, not
        waiting for it: its submission shows the agent, and tailing its logs can fail on its
        own (a WebSocket closed with code 1006 once the job ended, seen in a CI run)."""
        probe = subprocess.run(
            ["ray", "job", "submit", "--no-wait", "--address", self.dashboard, "--", "true"],
            env=self.env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        if probe.returncode == 0:
            return True
        if "No available agent" in probe.stdout + probe.stderr:
            return False
        raise RuntimeError(f"probe job failed: {probe.stdout}{probe.stderr}")

    def _agent_errors(self) -> str:
        """The dashboard agent's logged errors, for a failure message: the session folder goes
        with the cluster."""
        log = self.temp_dir / "session_latest" / "logs" / "dashboard_agent.log"
        text = log.read_text(errors="replace") if log.is_file() else ""
        errors = [line for line in text.splitlines() if "ERROR" in line or "Failed" in line]
        return "its agent's errors: " + (" | ".join(errors[-5:]) or "none logged")

    def job_status(self, submission_id: str) -> str:
        """Asked from a fresh process: Ray reads RAY_AUTH_MODE once per process."""
        code = (
            "import sys; from ray.job_submission import JobSubmissionClient as C; "
            "print(C(sys.argv[1]).get_job_status(sys.argv[2]).value)"
        )
        out = subprocess.run(
            [sys.executable, "-c", code, self.dashboard, submission_id],
            env=self.env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        return out.stdout.strip().splitlines()[-1] if out.stdout.strip() else out.stderr

    def _start(self, args: list[str], name: str) -> None:
        self.starting_log = self.log_dir / f"ray-{name}-{len(self.processes)}.log"
        log = self.starting_log.open("wb")
        self.processes.append(
            subprocess.Popen(
                args, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )

    def _gave_up(self) -> bool:
        """Ray's `ray start` gave up on its raylet's registration (its fixed 30 s) but its
        process lingers: seen in CI, the head's log said so at 66 s and the wait went on to its
        120 s, where a new start would have been made."""
        return "The current node timed out during startup" in self._starting_text()

    def _starting_text(self) -> str:
        log = self.starting_log
        return log.read_text(errors="replace") if log is not None and log.is_file() else ""

    def _wait(self, ready, what: str, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in self.processes) or self._gave_up():
                raise RuntimeError(f"{what} exited; logs in {self.log_dir}")
            try:
                if ready():
                    return
            except subprocess.TimeoutExpired:
                pass
            time.sleep(1)
        raise TimeoutError(f"{what} did not come up within {timeout_s} s; logs in {self.log_dir}")
