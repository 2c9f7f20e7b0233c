"""Posterior ensembles (``trainforge.workloads.sbi.ensemble``, ``trainforge ensemble``): posteriors
trained apart, written as one file that loads as sbi's EnsemblePosterior — the equal-weight
mixture of its members — and every wrong member refused in one line before anything is
written."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.unit.sbi_helpers import _data
from trainforge import cli
from trainforge.workloads.sbi import ensemble, export
from trainforge.workloads.sbi import estimator as estimators
from trainforge.workloads.sbi.config import EstimatorSection


def _member(path: Path, seed: int, prior: str = "two_moons") -> Path:
    """A posterior file of an estimator initialised with ``seed`` (untrained: members differ)."""
    theta, x = _data(500)
    torch.manual_seed(seed)
    record = estimators.BuildRecord.from_config(EstimatorSection(hidden_features=8), 2, 2)
    estimator = estimators.build(record, theta, x).eval()
    export.save_posterior(path, estimator, record, {"task": prior})
    return path


def test_an_ensemble_is_the_equal_weight_mixture_of_its_members(tmp_path: Path) -> None:
    from sbi.inference import EnsemblePosterior

    run = tmp_path / "runs" / "seed1"  # a run's folder stands for its posterior.pt
    files = [_member(tmp_path / "a.pt", 0), _member(run / "posterior.pt", 1)]
    out = tmp_path / "out" / "ensemble.pt"
    summary = ensemble.combine([files[0], run], out)
    assert summary == {"members": 2, "prior": "two_moons", "models": {"maf": 2}}
    assert not list(out.parent.glob(".*tmp"))  # written atomically, nothing left over
    torch.load(out, weights_only=True)  # plain data, as a checkpoint must be

    posterior = export.load_posterior(out)
    assert isinstance(posterior, EnsemblePosterior)
    members = [export.load_posterior(f) for f in files]
    x_obs = _data(1)[1][0]
    theta = members[0].sample((50,), x=x_obs, show_progress_bars=False)
    each = torch.stack([m.log_prob(theta, x=x_obs, norm_posterior=False) for m in members])
    mixture = posterior.log_prob(theta, x=x_obs, norm_posterior=False)
    torch.testing.assert_close(mixture, torch.logsumexp(each, 0) - math.log(2))
    assert not torch.allclose(each[0], each[1])  # two different members, not one twice

    samples = posterior.sample((300,), x=x_obs, show_progress_bars=False)
    assert samples.shape == (300, 2)
    assert bool(((samples >= -1) & (samples <= 1)).all())  # inside the prior box


def test_an_ensemble_given_as_a_member_adds_its_members(tmp_path: Path) -> None:
    pair = tmp_path / "pair.pt"
    ensemble.combine([_member(tmp_path / "a.pt", 0), _member(tmp_path / "b.pt", 1)], pair)
    summary = ensemble.combine([pair, _member(tmp_path / "c.pt", 2)], tmp_path / "three.pt")
    assert summary["members"] == 3
    assert len(export.load_posterior(tmp_path / "three.pt").posteriors) == 3


def test_wrong_members_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    a, b = _member(tmp_path / "a.pt", 0), _member(tmp_path / "b.pt", 1)
    other_task = _member(tmp_path / "c.pt", 2, prior="gaussian_mixture")
    (tmp_path / "unfinished").mkdir()
    torch.save({"format": "something else"}, tmp_path / "other.pt")
    (tmp_path / "text.pt").write_text("not torch")
    out = tmp_path / "out.pt"
    cases = {
        "has no posterior.pt": [a, tmp_path / "unfinished"],
        "does not exist": [a, tmp_path / "missing"],
        "listed more than once": [a, b, tmp_path / "a.pt"],
        "at least 2 posteriors; 1 given": [a],
        "prior gaussian_mixture is not": [a, other_task],
        "is not a trainforge posterior file": [a, tmp_path / "other.pt"],
    }
    for expected, members in cases.items():
        with pytest.raises(ensemble.EnsembleError, match=expected):
            ensemble.combine(members, out)
    with pytest.raises(ensemble.EnsembleError, match="is not a trainforge posterior file"):
        ensemble.combine([a, tmp_path / "text.pt"], out)
    with pytest.raises(ensemble.EnsembleError, match="is one of the members"):
        ensemble.combine([a, b], a)
    assert not out.exists()


def test_the_command_writes_an_ensemble_or_refuses_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = _member(tmp_path / "a.pt", 0), _member(tmp_path / "b.pt", 1)
    out = tmp_path / "ensemble.pt"
    assert cli.main(["ensemble", "--out", str(out), str(a), str(b)]) == 0
    said = capsys.readouterr()
    assert f"ensemble of 2 posteriors of two_moons (maf ×2) → {out}" in said.out
    assert "load_posterior" in said.out  # how to use it
    assert len(export.load_posterior(out).posteriors) == 2

    assert cli.main(["ensemble", "--out", str(tmp_path / "x.pt"), str(a)]) == 2
    said = capsys.readouterr()
    lines = [line for line in (said.out + said.err).splitlines() if line.strip()]
    assert len(lines) == 1 and "at least 2 posteriors" in lines[0]
    assert not (tmp_path / "x.pt").exists()


def test_the_member_format_is_the_export_format() -> None:
    assert ensemble.MEMBER_FORMAT == export.FORMAT  # kept apart only to avoid an import cycle


def _recipe(*overrides: str) -> object:
    from tests.conftest import RECIPES
    from trainforge import config

    return config.load(RECIPES / "sbi" / "two_moons_debug.yaml", list(overrides))


@pytest.mark.parametrize(
    ("overrides", "cluster", "members", "at_once"),
    [
        (["scaling.num_workers=1"], {"CPU": 2.0}, 4, 2),  # one CPU each
        ([], {"CPU": 2.0}, 4, 1),  # the recipe's two workers fill the machine
        (["scaling.num_workers=1", "scaling.use_gpu=true"], {"CPU": 64.0, "GPU": 4.0}, 8, 4),
        (["scaling.num_workers=1", "scaling.use_gpu=true"], {"CPU": 64.0, "GPU": 4.0}, 3, 3),
        (["scaling.use_gpu=true"], {"CPU": 64.0, "GPU": 4.0}, 4, 2),  # two GPUs a member
        (["scaling.num_workers=1", "scaling.use_gpu=true"], {"CPU": 2.0, "GPU": 4.0}, 4, 2),
        (["scaling.num_workers=1"], {"CPU": 1.0}, 4, 1),
    ],
)
def test_as_many_members_train_at_once_as_the_cluster_holds(
    overrides: list[str], cluster: dict[str, float], members: int, at_once: int
) -> None:
    from trainforge.driver import child_runs

    cfg = _recipe(*overrides)
    assert child_runs.runs_at_once(cfg, cluster, members) == at_once  # type: ignore[arg-type]


def test_a_member_is_the_same_command_on_the_ensembles_simulations(tmp_path: Path) -> None:
    from trainforge.driver import ensemble_run

    command = ensemble_run.member_command(
        "two_moons_debug", ["train.lr=0.01"], "/sims/two_moons-1", tmp_path / "members"
    )
    assert command[1:5] == ["-m", "trainforge", "train", "two_moons_debug"]
    assert command[5:] == [
        "train.lr=0.01",
        "workload.ensemble=1",  # a member is one run, not an ensemble of its own
        "workload.simulation.path=/sims/two_moons-1",
        f"run.storage_path={tmp_path / 'members'}",
    ]


def test_an_ensemble_of_fewer_than_one_member_is_refused() -> None:
    from trainforge.errors import RecipeError

    with pytest.raises(RecipeError, match=r"workload.ensemble: must be >= 1, got 0"):
        _recipe("workload.ensemble=0")


# A stand-in for a member's `trainforge train`: says its seed, then exits with the status the
# seed names (seed 7: 1), or (seed 9) waits until SIGTERM and says so.
MEMBER_SCRIPT = """
import signal, sys, time
seed = int(sys.argv[-1].split("=")[1])
def stop(*_):
    print("[trainforge] interrupted", flush=True)
    sys.exit(143)
signal.signal(signal.SIGTERM, stop)
print(f"[trainforge] seed {seed}", flush=True)
print("a line of its own", file=sys.stderr, flush=True)
if seed == 9:
    time.sleep(60)
sys.exit(1 if seed == 7 else 0)
"""


def _members(tmp_path: Path, *seeds: int) -> list:
    from trainforge.driver import child_runs

    return [
        child_runs.ChildRun(k, seed, f"e-m{k}", tmp_path / f"e-m{k}")
        for k, seed in enumerate(seeds)
    ]


def test_members_run_at_once_with_their_lines_marked(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import os
    import sys

    from trainforge.driver import child_runs

    members = _members(tmp_path, 0, 1, 2)
    command = [sys.executable, "-c", MEMBER_SCRIPT]
    child_runs.run_children(members, command, dict(os.environ), 2, "ensemble")
    assert [m.exit_code for m in members] == [0, 0, 0]
    out, err = capfd.readouterr()
    for k in range(3):
        assert f"[trainforge] m{k}: seed {k}\n" in out  # its own voice, marked
        assert f"[trainforge] m{k}| a line of its own\n" in err  # anything else, marked too
        assert f"ensemble: m{k} started (run.seed {k})" in out


def test_after_a_member_fails_no_other_starts(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import os
    import sys

    from trainforge.driver import child_runs

    members = _members(tmp_path, 7, 1, 2)
    child_runs.run_children(members, [sys.executable, "-c", MEMBER_SCRIPT], dict(os.environ), 1,
                            "ensemble")  # fmt: skip
    assert members[0].exit_code == 1
    assert [m.process for m in members[1:]] == [None, None]
    assert "m1 started" not in capfd.readouterr().out


def test_a_stopped_ensemble_stops_its_members_the_way_a_run_stops(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import subprocess
    import sys
    import time

    from trainforge.driver import child_runs

    members = _members(tmp_path, 9, 9)
    for m in members:  # running members that did not get the Ctrl-C (a SIGTERM to the command)
        command = [sys.executable, "-c", MEMBER_SCRIPT, "run.seed=9"]
        m.process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        assert m.process.stdout is not None
        assert m.process.stdout.readline() == "[trainforge] seed 9\n"  # its handler is set
    started = time.monotonic()
    child_runs.stop_children(members)
    assert time.monotonic() - started < 30  # SIGTERM after ~2 s, not the script's 60 s
    for m in members:
        assert m.process is not None and m.process.returncode == 143
        assert m.process.stdout is not None
        assert m.process.stdout.read() == "[trainforge] interrupted\n"
