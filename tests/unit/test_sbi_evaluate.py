"""The evaluation's first line: what it is about to do (a C2ST can take minutes), or nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainforge.workloads.sbi.config import EvaluationSection
from trainforge.workloads.sbi.evaluate import announce, conclude


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


def concluded(capsys: pytest.CaptureFixture[str], metrics: dict[str, float], numbers: list[int],
              **settings: object) -> str:  # fmt: skip
    conclude(metrics, numbers, "sbibm", EvaluationSection(**settings), 12.4)  # type: ignore[arg-type]
    return capsys.readouterr().out


def test_the_evaluation_ends_with_its_outcome_in_words(capsys: pytest.CaptureFixture[str]) -> None:
    sbc = {"sbc/ks_pvalue_dim0": 0.4, "sbc/ks_pvalue_min": 0.25612, "sbc/max_ecdf_deviation": 0.14}
    one = {"c2st/obs3": 0.79049, "c2st/mean": 0.79049, "c2st/seconds": 5.9}
    assert concluded(capsys, one | sbc, [3], sbc_runs=50) == (
        "[trainforge] evaluation done in 12 s: C2ST 0.790 at sbibm observation 3 (0.5: its "
        "samples cannot be told from the reference's); SBC over 50 runs: smallest rank KS "
        "p-value 0.256, largest rank ECDF deviation 0.140\n"
    )
    several = {"c2st/obs1": 0.6, "c2st/obs2": 0.7, "c2st/mean": 0.65}
    said_several = concluded(capsys, several, [1, 2], sbc_runs=0)
    assert "C2ST mean 0.650 over 2 sbibm observations" in said_several
    assert "SBC" not in said_several and said_several.count("\n") == 1
    assert concluded(capsys, {}, [], sbc_runs=0) == ""  # nothing asked, nothing said


class _Unsampled:
    """A posterior the evaluation must not sample."""

    def sample(self, *args: object, **kwargs: object) -> None:
        raise AssertionError("sampled")

    sample_batched = sample


def test_sbc_is_skipped_in_one_line_for_a_posterior_that_samples_by_mcmc(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    from trainforge.workloads.sbi import evaluate, sources
    from trainforge.workloads.sbi.config import SBIWorkloadConfig

    source = sources.resolve(SBIWorkloadConfig())
    cfg = EvaluationSection(observations=[], sbc_runs=50)
    metrics, files = evaluate.run_posterior(_Unsampled(), source, cfg, 0, tmp_path, method="nle")
    assert (metrics, files) == ({}, [])
    assert capsys.readouterr().out == (
        "[trainforge] evaluation: SBC and TARP skipped (workload.evaluation.sbc_runs 50): "
        "method nle's posterior runs MCMC chains at each of those observations; sbc_runs 0 "
        "asks for none\n"
    )
