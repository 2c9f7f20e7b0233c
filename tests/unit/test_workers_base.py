"""The one failure policy over every worker group (``driver/workers/base.py``), in this process
with a group that plays back outcomes: a restart within ``run.max_failures`` said once, naming
the rank whose process died or that raised rather than the peers it left waiting; the run's own
stop (NaN) never restarted; a taken rendezvous port started again without using a restart; a
stop ends the processes. The same policy on real processes of each group is
tests/integration/test_worker_groups.py."""

from __future__ import annotations

import pickle
import socket
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from trainforge.driver.workers import base
from trainforge.driver.workers.base import Finished, WorkerGroup, WorkersFailed, run_with_restarts
from trainforge.errors import NonFiniteLoss
from trainforge.worker.own import portable
from trainforge.worker.payload import WorkerPayload

PAYLOAD = WorkerPayload(recipe={}, run_dir="/runs/r", command="c0", requested_at=0.0)


class PlayedBack(WorkerGroup):
    """A group whose attempts end as ``outcomes`` says, in order (an exception is raised)."""

    kind = "played-back"

    def __init__(self, *outcomes: object) -> None:
        super().__init__(None)  # type: ignore[arg-type]
        self.outcomes = list(outcomes)
        self.calls: list[str] = []
        self.payloads: list[WorkerPayload] = []

    def start(self) -> None:
        self.calls.append("start")

    def run(self, payload: WorkerPayload) -> Finished | base.Failures:
        self.calls.append("run")
        self.payloads.append(payload)
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome  # type: ignore[return-value]

    def stop(self) -> None:
        self.calls.append("stop")


def test_a_failure_within_max_failures_restarts_the_group_once_said(
    capsys: pytest.CaptureFixture[str],
) -> None:
    killed = base.died(0, 4242, base.how_it_ended(-9))
    group = PlayedBack({1: RuntimeError("Connection reset by peer"), 0: killed},
                       Finished({"val/loss": 0.1}, "/runs/r/checkpoint_1"))  # fmt: skip
    finished = run_with_restarts(group, PAYLOAD, max_failures=1)
    assert finished.checkpoint_path == "/runs/r/checkpoint_1"
    assert group.calls == ["run", "stop", "start", "run"]
    assert group.payloads[1].requested_at > PAYLOAD.requested_at  # the new start is timed anew
    assert group.payloads[1].command == PAYLOAD.command  # one command: its restarts counted
    assert capsys.readouterr().out.splitlines() == [
        "[trainforge] worker process 4242 (rank 0) was killed by SIGKILL (out of memory: the "
        "kernel's OOM killer; or a kill -9); restarting the workers"
    ]


# what gloo raises in rank 0's all-reduce once rank 1 has left the group (torch 2.13)
PEER_LEFT = RuntimeError(
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
    "by peer [127.0.0.1]:65183. This is typically caused by a remote worker crashing. Check "
    "the logs of the remote worker before reporting an error."
)


def test_a_restart_names_the_rank_that_raised_not_the_peer_left_waiting_whichever_answered_first(
    capsys: pytest.CaptureFixture[str],
) -> None:
    raised = RuntimeError("injected error at step 100")
    group = PlayedBack({0: PEER_LEFT, 1: raised}, Finished({}, None))  # read in rank order
    run_with_restarts(group, PAYLOAD, max_failures=1)
    assert capsys.readouterr().out.splitlines() == [
        "[trainforge] rank 1 failed (RuntimeError: injected error at step 100); restarting "
        "the workers"
    ]
    failed = WorkersFailed({0: PEER_LEFT, 1: raised})  # and where no restart is left
    assert str(failed) == "rank 1: RuntimeError: injected error at step 100"
    assert str(WorkersFailed({1: PEER_LEFT})).startswith("rank 1: RuntimeError: [")  # alone


def test_no_restart_is_left_or_the_run_stopped_itself_ends_it_with_every_failed_rank() -> None:
    error = RuntimeError("boom")
    group = PlayedBack({1: error}, {0: error})
    with pytest.raises(WorkersFailed, match="rank 0: RuntimeError: boom") as failed:
        run_with_restarts(group, PAYLOAD, max_failures=1)
    assert failed.value.worker_failures == {0: error}
    assert group.calls == ["run", "stop", "start", "run", "stop"]
    nan = NonFiniteLoss("train/loss became nan by step 3")
    group = PlayedBack({0: nan, 1: nan})
    with pytest.raises(WorkersFailed, match="NonFiniteLoss"):  # restarting would repeat it
        run_with_restarts(group, PAYLOAD, max_failures=5)
    assert group.calls == ["run", "stop"]


def test_a_stop_ends_the_processes_before_it_goes_on() -> None:
    group = PlayedBack(KeyboardInterrupt())
    with pytest.raises(KeyboardInterrupt):
        run_with_restarts(group, PAYLOAD, max_failures=3)
    assert group.calls == ["run", "stop"]


def test_a_failed_group_names_the_first_rank_and_keeps_every_cause() -> None:
    class Wrapped(Exception):  # what Ray's RayTaskError carries: the worker's own exception
        def __init__(self, cause: BaseException) -> None:
            super().__init__("ray::WarmWorker.run() failed")
            self.cause = cause

    failed = WorkersFailed({1: Wrapped(torch.OutOfMemoryError("no room"))})
    assert str(failed) == "rank 1: OutOfMemoryError: no room"
    assert str(WorkersFailed({}, "the controller failed")) == "the controller failed"


def port_taken_error() -> dist.DistNetworkError:
    """What rank 0's TCP store (``process_group.join``) raises on a port another process took."""
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        try:
            dist.TCPStore("127.0.0.1", port, 1, is_master=True, timeout=timedelta(seconds=5))
        except dist.DistNetworkError as exc:
            return exc
    raise AssertionError(f"the store listened on port {port}, which another socket holds")


def as_it_arrives(error: BaseException, path: str) -> BaseException:
    """A worker's exception as the driver gets it: unwrapped from Ray's RayTaskError from a
    warm worker (``base.from_ray``), pickled over the pipe from a command's own worker
    (``worker/own.py``)."""
    if path == "warm":
        from ray.exceptions import RayTaskError

        return base.from_ray(RayTaskError("WarmWorker.run", "Traceback: ...", error), 0)
    return pickle.loads(pickle.dumps(portable(error)))


@pytest.mark.parametrize("path", ["warm", "own"])
def test_a_group_whose_rendezvous_port_was_taken_starts_again_without_using_a_restart(
    path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    group = PlayedBack({0: as_it_arrives(port_taken_error(), path)}, Finished({}, None))
    finished = run_with_restarts(group, PAYLOAD, max_failures=0)
    assert isinstance(finished, Finished)  # max_failures 0: no restart was used
    assert group.calls == ["run", "stop", "start", "run"]
    assert capsys.readouterr().out.splitlines() == [
        "[trainforge] rank 0's rendezvous port was taken by another process; starting the "
        "workers again on another port"
    ]


def test_a_rendezvous_port_taken_at_every_start_ends_the_run_all_the_same() -> None:
    taken = as_it_arrives(port_taken_error(), "warm")
    group = PlayedBack(*[{0: taken}] * (2 + base.PORT_TAKEN_RESTARTS))
    with pytest.raises(WorkersFailed, match=r"rank 0: DistNetworkError: .*EADDRINUSE"):
        run_with_restarts(group, PAYLOAD, max_failures=0)
    assert group.calls.count("run") == 1 + base.PORT_TAKEN_RESTARTS
    # the same text from the loop's own code is an ordinary failure: max_failures 0 ends it
    group = PlayedBack({0: OSError(98, "EADDRINUSE: address already in use")})
    with pytest.raises(WorkersFailed, match=r"rank 0: OSError: .*EADDRINUSE"):
        run_with_restarts(group, PAYLOAD, max_failures=0)
    assert group.calls.count("run") == 1
