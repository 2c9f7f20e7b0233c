"""The one [trainforge] voice: progress on stdout, warnings once, errors and refusals on stderr."""

from __future__ import annotations

import pytest

from trainforge import log


def test_lines_carry_the_prefix_and_go_to_their_stream(capsys: pytest.CaptureFixture) -> None:
    log.say("training 10 steps")
    log.error("training failed: boom")
    log.refuse("train.lr: must be > 0, got -1")
    out, err = capsys.readouterr()
    assert out == "[trainforge] training 10 steps\n"
    assert err.splitlines() == [
        "[trainforge] training failed: boom",
        "trainforge: error: train.lr: must be > 0, got -1",
    ]


def test_a_warning_is_said_once_per_key(capsys: pytest.CaptureFixture) -> None:
    for step in range(3):
        log.warn(f"MLflow stopped answering at step {step}", key="test-outage")
    log.warn("another problem (test)")
    log.warn("another problem (test)")
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "[trainforge] warning: MLflow stopped answering at step 0",
        "[trainforge] warning: another problem (test)",
    ]


def test_first_line_of_an_exception() -> None:
    assert log.first_line(ValueError("bad value\nmore detail")) == "bad value"
    assert log.first_line(KeyError()) == "KeyError"
    assert len(log.first_line(RuntimeError("x" * 1000))) == 300
