"""Workers that gave up waiting for a stopped rank, told in one line
(``trainforge.driver.collective_timeout``): in a torch collective (gloo's timeout) or at a
checkpoint report (Ray Train's barrier timeout); other failures are left to the other
explanations."""

from __future__ import annotations

from ray.train import WorkerGroupError
from ray.train.v2._internal.exceptions import BroadcastCollectiveTimeoutError

from tests.conftest import RECIPES
from trainforge import config
from trainforge.driver import collective_timeout
from trainforge.errors import CollectiveFailed

DIGITS = RECIPES / "cnn" / "digits_simple_cnn.yaml"
# gloo's own message, as rank 0 raised it in tests/integration/test_kills.py
GLOO = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
    "waiting 5000ms for recv operation to complete"
)
WHY = (
    "that stopped responding (a deadlock, a stuck data loader, device or storage); all workers "
    "were stopped. If a worker is only slow at times (a long evaluation or checkpoint on one "
    "rank), raise scaling.timeout_s; the same command resumes from the last checkpoint"
)


def failed(failures: dict[int, Exception]) -> WorkerGroupError:
    return WorkerGroupError("Training failed due to worker errors", failures)


def test_a_rank_that_timed_out_in_a_collective_is_one_line_naming_the_setting() -> None:
    cfg = config.load(DIGITS, ["scaling.timeout_s=5"])
    line = collective_timeout.explain(failed({0: RuntimeError(GLOO)}), cfg)
    assert line == f"rank 0 waited scaling.timeout_s=5 s in a collective for a worker {WHY}"
    both = collective_timeout.explain(failed({1: RuntimeError(GLOO), 0: RuntimeError(GLOO)}), cfg)
    assert both is not None and both.startswith("rank 0, 1 waited")


def test_a_rank_that_timed_out_at_a_report_names_the_rank_it_waited_for() -> None:
    cfg = config.load(DIGITS, ["scaling.timeout_s=10"])
    barrier = BroadcastCollectiveTimeoutError(10.05, missing_ranks=[2, 3], timeout_s=10.0)
    line = collective_timeout.explain(failed({0: barrier, 1: barrier}), cfg)
    assert line == (
        "rank 0, 1 waited scaling.timeout_s=10 s at a checkpoint report (ray.train.report) for "
        f"rank 2, 3, a worker {WHY}"
    )


def test_other_failures_are_not_called_a_timeout() -> None:
    cfg = config.load(DIGITS, [])
    assert collective_timeout.explain(failed({0: RuntimeError("shape mismatch")}), cfg) is None
    assert collective_timeout.explain(failed({0: ValueError(GLOO)}), cfg) is None
    assert collective_timeout.explain(RuntimeError(GLOO), cfg) is None  # not from the workers


def test_an_incomplete_all_reduce_is_told_as_a_rank_that_stopped_responding() -> None:
    cfg = config.load(DIGITS, ["scaling.timeout_s=15"])
    incomplete = CollectiveFailed("the all-reduce of step 30 came back incomplete")
    line = collective_timeout.explain(failed({0: incomplete}), cfg)
    assert line == f"rank 0 waited scaling.timeout_s=15 s in a collective for a worker {WHY}"
