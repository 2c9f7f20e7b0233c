"""The evaluation's first line: what it is about to do (a C2ST can take minutes), or nothing."""

from __future__ import annotations

import pytest

from trainforge.workloads.sbi.config import EvaluationSection
from trainforge.workloads.sbi.evaluate import announce


def said(capsys: pytest.CaptureFixture[str], numbers: list[int], **settings: object) -> str:
    announce(numbers, "sbibm", EvaluationSection(**settings))  # type: ignore[arg-type]
    return capsys.readouterr().out


def test_the_evaluation_says_what_it_is_about_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    assert said(capsys, [1, 2], sbc_runs=200) == (
        "[trainforge] evaluation: the posterior at sbibm observations 1, 2, C2ST against "
        "reference samples; SBC over 200 runs\n"
    )
    assert said(capsys, [3], c2st=False, sbc_runs=0) == (
        "[trainforge] evaluation: the posterior at sbibm observation 3\n"
    )


def test_an_evaluation_asked_for_nothing_says_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert said(capsys, [], sbc_runs=0) == ""
