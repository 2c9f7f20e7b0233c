"""`trainforge train` with ``workload.ensemble`` (``driver/ensemble_run.py``), as a user runs it:
the members trained at once on one set of simulations, each a run of its own nested under the
ensemble's MLflow run; their mixture written, evaluated and logged; a re-run with more members
keeps the finished ones; a member that fails leaves the ensemble as it was; a changed recipe is
refused before anything starts. The commands run in a home of their own, on its lasting local
cluster and its warm workers, as a user's do by default (half the time of a private Ray and
Ray Train's worker groups for every member: 58 s against 106 s alone on 2 cores); the
members' join of a named cluster is ``child_runs.child_env``'s, tested in
tests/unit/test_sbi_ensemble.py."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests import faults
from tests.integration.test_local_cluster import env_for, trainforge

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# Two members at once on these 2 cores: one worker each, few epochs, a small evaluation
SMALL = [
    "scaling.num_workers=1", "train.epochs=3", "checkpoint.every_epochs=1",
    "workload.evaluation.sbc_runs=0", "workload.evaluation.num_samples=500", "run.name=ens",
]  # fmt: skip


def _train(home: Path, folder: Path, *overrides: str, env: dict[str, str] | None = None):
    command = [*trainforge(), "train", "two_moons_debug", *SMALL, *overrides]
    return subprocess.run(
        command, cwd=folder, env={**env_for(home), **(env or {})}, capture_output=True,
        text=True, timeout=600,
    )  # fmt: skip


def test_an_ensemble_trains_its_members_then_writes_and_scores_their_mixture(
    home: Path, in_tmp: Path
) -> None:
    from mlflow.tracking import MlflowClient
    from sbi.inference import EnsemblePosterior

    from trainforge.workloads.sbi import load_posterior

    first = _train(home, in_tmp, "workload.ensemble=2")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    out = first.stdout
    assert "ensemble: 2 members (run.seed 0-1) on the same simulations, 2 at a time" in out
    assert out.count("simulations ready:") == 3  # made once; each member finds them ready
    for member in ("m0", "m1"):  # each member's own lines, marked with it
        assert f"[trainforge] {member}: run 'ens-{member}' finished in " in out
    assert "[trainforge]   ensemble  c2st/mean " in out

    run = in_tmp / "runs" / "ens"
    posterior = load_posterior(run / "posterior.pt")
    assert isinstance(posterior, EnsemblePosterior) and len(posterior.posteriors) == 2
    record = json.loads((run / "ensemble.json").read_text())
    assert [(m["name"], m["seed"]) for m in record["members"]] == [("ens-m0", 0), ("ens-m1", 1)]
    assert 0.5 <= record["metrics"]["c2st/mean"] <= 1.0
    assert (run / "evaluation" / "pair_plot_obs1.png").is_file()
    for m in record["members"]:  # whole runs of their own, on the one set of simulations
        assert (Path(m["folder"]) / "posterior.pt").is_file()
        assert float(m["val/loss"]) < 0

    client = MlflowClient(f"sqlite:///{in_tmp / 'mlflow.db'}")
    runs = {r.info.run_name: r for r in client.search_runs([client.get_experiment_by_name(
        "trainforge").experiment_id])}  # fmt: skip
    parent = runs["ens"]
    assert parent.info.status == "FINISHED" and parent.data.metrics["ensemble/members"] == 2
    assert parent.data.metrics["c2st/mean"] == pytest.approx(record["metrics"]["c2st/mean"])
    assert {a.path for a in client.list_artifacts(parent.info.run_id)} >= {
        "posterior",
        "evaluation",
    }
    for name in ("ens-m0", "ens-m1"):
        assert runs[name].data.tags["mlflow.parentRunId"] == parent.info.run_id

    # More members: the finished ones are kept; the new one fails, and the ensemble stays
    # the two-member one (nothing half-written)
    before = (run / "posterior.pt").read_bytes()
    grown = _train(home, in_tmp, "workload.ensemble=3",
                   env=faults.env({}, **{faults.FAIL_AFTER_EPOCH: 1}))  # fmt: skip
    assert grown.returncode == 1, grown.stdout[-3000:] + grown.stderr[-3000:]
    assert "3 members (run.seed 0-2) on the same simulations, 2 at a time; 2 finished " \
           "earlier, kept" in grown.stdout  # fmt: skip
    assert "ensemble: m2 started (run.seed 2)" in grown.stdout
    assert "m2: workers: 1 warm, process group up" in grown.stdout  # a first member's worker
    assert "m0 started" not in grown.stdout and "m1 started" not in grown.stdout
    assert "ensemble: members failed: m2 (exit 1)" in grown.stderr
    assert (run / "posterior.pt").read_bytes() == before

    # Another learning rate would mix members of two recipes: refused before anything starts
    changed = _train(home, in_tmp, "workload.ensemble=3", "train.lr=0.01")
    assert changed.returncode == 2
    assert "train.lr 0.002 -> 0.01" in changed.stderr and "ray:" not in changed.stdout
