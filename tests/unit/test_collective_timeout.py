"""A collective's timeout behind a failed run, told in one line
(``trainforge.driver.collective_timeout``); other failures are left to the other explanations."""

from __future__ import annotations

from ray.train import WorkerGroupError

from tests.conftest import RECIPES
from trainforge import config
from trainforge.driver import collective_timeout

# gloo's own message, as rank 0 raised it in tests/integration/test_kills.py
GLOO = (
    "[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78] Timed out "
    "waiting 5000ms for recv operation to complete"
)


def failed(failures: dict[int, Exception]) -> WorkerGroupError:
    return WorkerGroupError("Training failed due to worker errors", failures)


def test_a_rank_that_timed_out_in_a_collective_is_one_line_naming_the_setting() -> None:
    cfg = config.load(RECIPES / "cnn" / "digits_simple_cnn.yaml", ["scaling.timeout_s=5"])
    line = collective_timeout.explain(failed({0: RuntimeError(GLOO)}), cfg)
    assert line == (
        "rank 0 waited scaling.timeout_s=5 s in a collective for a worker that stopped "
        "responding (a deadlock, a stuck data loader or device); all workers were stopped. "
        "If a worker is only slow at times (a long evaluation or checkpoint on one rank), "
        "raise scaling.timeout_s; the same command resumes from the last checkpoint"
    )
    both = collective_timeout.explain(failed({1: RuntimeError(GLOO), 0: RuntimeError(GLOO)}), cfg)
    assert both is not None and both.startswith("rank 0, 1 waited")


def test_other_failures_are_not_called_a_timeout() -> None:
    cfg = config.load(RECIPES / "cnn" / "digits_simple_cnn.yaml", [])
    assert collective_timeout.explain(failed({0: RuntimeError("shape mismatch")}), cfg) is None
    assert collective_timeout.explain(failed({0: ValueError(GLOO)}), cfg) is None
    assert collective_timeout.explain(RuntimeError(GLOO), cfg) is None  # not from the workers
