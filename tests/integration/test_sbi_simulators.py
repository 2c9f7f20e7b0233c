"""A CPU-bound simulator by import path (the shipped SIR example, one SciPy ODE solve per
simulation) through the simulation stage: spread over the processes of the shared local Ray and
over both nodes of a two-node cluster; the rows on which it raises or gives NaN counted
exactly, recorded in the manifest, the console and MLflow, and dropped; the data identical to
simulating the same chunks one after another in this process."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from tests.integration.ray_nodes import RayNodes
from trainforge import config
from trainforge.driver import launch
from trainforge.tracking.client import resolve_uri
from trainforge.workloads.sbi import simulating, simulations

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "sbi" / "sir_custom.yaml"

# The shipped example, made to fail on a region of its prior as real solvers do: it raises when
# β > 0.8 (about 8% of the prior) and gives NaN when γ > 0.16 (about 11%).
FAILING_SIR = """
import numpy as np

from trainforge.workloads.sbi.examples import sir

prior = sir.prior


def simulate(theta):
    rows = np.asarray(theta, dtype=np.float64).reshape(-1, 2)
    if (rows[:, 0] > 0.8).any():
        raise FloatingPointError("solver diverged")
    x = sir.simulate(theta)
    x[rows[:, 1] > 0.16] = float("nan")
    return x
"""


def _failing_recipe(folder: Path) -> list[str]:
    (folder / "failing_sir.py").write_text(FAILING_SIR)
    return [
        "workload.prior=failing_sir:prior", "workload.simulator=failing_sir:simulate",
        "workload.simulation.num_simulations=400", "run.name=sir-2w", "scaling.num_workers=2",
        "scaling.use_gpu=false", "train.epochs=2", "train.batch_size=32",
        "workload.estimator.model=maf", "workload.estimator.hidden_features=16",
        "workload.estimator.num_transforms=2", "workload.evaluation.sbc_runs=20",
        "workload.evaluation.sbc_samples=50", "workload.evaluation.pair_plot=false",
    ]  # fmt: skip


def test_a_scipy_simulator_spreads_over_processes_and_its_failures_are_counted(
    ray_cluster, in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = config.load(RECIPE, _failing_recipe(in_tmp))
    outcome = launch.train(cfg)
    assert outcome.exit_code == 0 and outcome.num_workers == 2

    (folder,) = (in_tmp / "runs" / "simulations").iterdir()
    manifest = simulations.read_manifest(folder)
    # 400 simulations in chunks of 16 (per-sample simulators get small chunks to spread)
    assert (manifest["chunks"], manifest["chunk_size"]) == (25, 16)
    ((_, ran),) = manifest["ran_on"].items()
    assert ran["simulations"] == 400 and ran["processes"] >= 2, manifest["ran_on"]

    chunks = [simulations.read_chunk(simulations.chunk_file(folder, i)) for i in range(25)]
    theta = torch.cat([t for t, _ in chunks])
    x = torch.cat([x for _, x in chunks])
    raised = theta[:, 0] > 0.8
    invalid = raised | (theta[:, 1] > 0.16)
    assert 0 < int(raised.sum()) < int(invalid.sum()) < 400
    assert manifest["failed"] == int(raised.sum())
    assert manifest["invalid"] == int(invalid.sum())
    assert bool(x[invalid].isnan().all()) and bool(torch.isfinite(x[~invalid]).all())
    assert manifest["first_failure"].startswith("FloatingPointError: solver diverged at θ = [")

    # The same chunks simulated one after another in this process: the same data, so where
    # (and on how many processes) the chunks ran changes nothing
    section = cfg.workload
    for index, (chunk_theta, chunk_x) in enumerate(chunks):
        alone = simulating.simulate_chunk(section, manifest["seed"], index, len(chunk_theta), "cpu")
        assert torch.equal(alone["theta"], chunk_theta)
        torch.testing.assert_close(alone["x"], chunk_x, rtol=0, atol=0, equal_nan=True)

    out = capsys.readouterr().out
    assert (
        f"simulations: {manifest['invalid']} of 400 are invalid: {manifest['failed']} raised in "
        f"the simulator (first: {manifest['first_failure']}), "
        f"{manifest['invalid'] - manifest['failed']} have NaN/inf in x"
    ) in out
    assert "simulations: 400 in " in out and f"by {ran['processes']} processes on 1 node" in out

    client = MlflowClient(tracking_uri=resolve_uri(None))
    (dataset,) = client.get_run(outcome.mlflow_run_id).inputs.dataset_inputs
    profile = json.loads(dataset.dataset.profile)
    assert (profile["invalid"], profile["failed"]) == (manifest["invalid"], manifest["failed"])
    valid = 400 - manifest["invalid"]
    assert profile["num_rows"] + profile["val_rows"] == valid  # the invalid rows were dropped
    sys.modules.pop("failing_sir", None)


def test_a_two_node_cluster_simulates_on_both_nodes(tmp_path: Path) -> None:
    """Enough work that the second node's worker starts before the first has done it all: Ray
    gives a finished task's worker the next queued one, so a stage shorter than a new worker's
    start (its torch import: seconds on a loaded 2-core machine) runs on one node (seen in CI:
    320 simulations in 3.0 s, "by 1 process on 1 node")."""
    count = 1920  # ~10 s of one core here, ~18 s at CI's loaded rate
    nodes = RayNodes(tmp_path).start_head("--num-cpus=1")
    try:
        nodes.add_node("--num-cpus=1")
        done = subprocess.run(
            [sys.executable, "-m", "trainforge", "simulate", str(RECIPE),
             f"workload.simulation.num_simulations={count}",
             f"run.storage_path={tmp_path / 'runs'}"],
            env={**nodes.env, "RAY_ADDRESS": nodes.gcs}, capture_output=True, text=True,
            timeout=300,
        )  # fmt: skip
    finally:
        nodes.stop()
    assert done.returncode == 0, done.stdout + done.stderr
    assert " processes on 2 nodes" in done.stdout, done.stdout
    (folder,) = (tmp_path / "runs" / "simulations").iterdir()
    ran_on = simulations.read_manifest(folder)["ran_on"]
    assert len(ran_on) == 2, ran_on  # both raylets' CPUs simulated
    assert all(r["simulations"] > 0 for r in ran_on.values())
    assert sum(r["simulations"] for r in ran_on.values()) == count
