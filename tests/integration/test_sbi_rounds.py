"""`trainforge train` with ``workload.rounds`` (``driver/rounds_run.py``), as a user runs it:
two sequential rounds whose simulations spread over a two-node Ray cluster joined by address,
the second round's θ drawn from the prior truncated to the first round's posterior (NPE), each
round a run nested under the command's MLflow run; and a sequential NLE run stopped with Ctrl-C
in its second round, which the same command resumes there (the first round kept, nothing
simulated or drawn again, the round's run resumed from its checkpoint) and ends with the
posterior of an uninterrupted run, bitwise."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
from pathlib import Path

import pytest
import torch

import trainforge
from tests import faults
from tests.integration.ray_nodes import RayNodes
from tests.integration.test_local_cluster import env_for
from tests.integration.test_local_cluster import trainforge as command
from trainforge.workloads.sbi import simulations

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def _runs(folder: Path) -> dict:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("trainforge").experiment_id
    return {r.info.run_name: r for r in client.search_runs([experiment])}, client


def test_two_npe_rounds_simulate_on_a_two_node_cluster_nested_under_one_run(
    tmp_path: Path,
) -> None:
    from sbi.inference import DirectPosterior

    from trainforge.workloads.sbi import load_posterior

    nodes = RayNodes(tmp_path).start_head("--num-cpus=1", wait_for_jobs=False)
    try:
        nodes.add_node("--num-cpus=1")
        done = subprocess.run(
            [*command(), "train", "two_moons_debug", "run.name=seq", "workload.rounds=2",
             "workload.simulation.where=cluster", "workload.simulation.num_simulations=1000",
             "workload.simulation.chunk_size=250", "train.epochs=4", "checkpoint.every_epochs=2",
             "workload.evaluation.num_samples=200", f"run.storage_path={tmp_path / 'runs'}"],
            cwd=tmp_path, env={**nodes.env, "RAY_ADDRESS": nodes.gcs}, capture_output=True,
            text=True, timeout=900,
        )  # fmt: skip
    finally:
        nodes.stop()
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-3000:]
    assert "[trainforge] sequential: 2 rounds\n" in out
    assert ("sequential: round r1: 1,000 θ from the prior truncated to round seq-r0's posterior "
            "at observation 1 (it keeps ") in out  # fmt: skip
    assert out.count("to simulate for 1,000 two_moons simulations on ") == 2  # the cluster's
    for label in ("r0", "r1"):
        assert f"[trainforge] {label}: run 'seq-{label}' finished in " in out

    run = tmp_path / "runs" / "seq"
    proposal = torch.load(run / "rounds" / "proposal-r1.pt", weights_only=True)
    entries = [json.loads(p.read_text()) for p in (tmp_path / "runs" / "simulations").glob(
        "*/manifest.json")]  # fmt: skip
    [second] = [e for e in entries if "proposal" in e]
    assert second["ran_on"]  # simulated by the cluster's worker processes
    folder = tmp_path / "runs" / "simulations" / f"two_moons-{second['key']}"
    theta, _ = simulations.load(folder, drop_invalid=False)
    assert torch.equal(theta, proposal)  # the round simulated the θ drawn for it
    combined = simulations.read_manifest(run / "rounds" / "data-r1")
    assert combined["num_simulations"] == 2000  # round r1 trained on both rounds' simulations

    posterior = load_posterior(run / "posterior.pt")
    assert isinstance(posterior, DirectPosterior)
    assert isinstance(trainforge.load(run), DirectPosterior)  # the run folder, as for any run
    last = run / "rounds" / "seq-r1" / "posterior.pt"
    assert (run / "posterior.pt").read_bytes() == last.read_bytes()
    record = json.loads((run / "rounds.json").read_text())
    assert [r["name"] for r in record["rounds"]] == ["seq-r0", "seq-r1"]
    assert all(0.5 <= float(r["c2st/mean"]) <= 1.0 for r in record["rounds"])

    runs, client = _runs(tmp_path)
    parent = runs["seq"]
    assert parent.info.status == "FINISHED"
    history = client.get_metric_history(parent.info.run_id, "round/c2st/mean")
    assert [m.step for m in history] == [1, 2]
    assert [m.value for m in history] == [float(r["c2st/mean"]) for r in record["rounds"]]
    for name in ("seq-r0", "seq-r1"):
        assert runs[name].info.status == "FINISHED"
        assert runs[name].data.tags["mlflow.parentRunId"] == parent.info.run_id


NLE = [
    "two_moons_nle_debug", "run.name=snle", "workload.rounds=2", "scaling.num_workers=1",
    "workload.simulation.num_simulations=1000", "train.epochs=6", "checkpoint.every_epochs=1",
    "workload.evaluation.num_samples=200", "workload.posterior.warmup_steps=10",
]  # fmt: skip


def test_a_sequential_nle_run_stopped_in_its_second_round_resumes_there(
    home: Path, in_tmp: Path
) -> None:
    from sbi.inference import MCMCPosterior

    from trainforge.workloads.sbi import load_posterior

    # every step 0.05 s longer (the same computation): the Ctrl-C lands inside round r1
    slow = faults.env(env_for(home), **{faults.SLOW_FROM_STEP: 1})
    # stoppable as from a terminal, however pytest was started (a shell's background job
    # ignores SIGINT, and its children inherit that)
    first = subprocess.Popen(
        [*command(), "train", *NLE], cwd=in_tmp, env=slow, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True, start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    said: list[str] = []

    def ctrl_c_in_round_r1() -> None:
        assert first.stdout is not None
        for line in first.stdout:
            said.append(line)
            if line.startswith("[trainforge] r1: epoch 2/6 done"):
                os.killpg(first.pid, signal.SIGINT)  # as a terminal's Ctrl-C

    reader = threading.Thread(target=ctrl_c_in_round_r1)
    reader.start()
    assert first.wait(timeout=600) == 130, "".join(said)[-4000:]
    reader.join(timeout=30)
    drawn = "".join(said)
    assert "sequential: round r1: 1,000 θ from round snle-r0's posterior at observation 1 " \
           "(MCMC)" in drawn  # fmt: skip
    run = in_tmp / "runs" / "snle"
    proposal = (run / "rounds" / "proposal-r1.pt").read_bytes()
    assert not (run / "posterior.pt").exists()  # nothing half-written

    again = subprocess.run([*command(), "train", *NLE], cwd=in_tmp, env=env_for(home),
                           capture_output=True, text=True, timeout=600)  # fmt: skip
    out = again.stdout
    assert again.returncode == 0, out[-4000:] + again.stderr[-3000:]
    assert "sequential: 2 rounds; 1 finished earlier, kept" in out
    assert "r0 started" not in out and "sequential: round r1:" not in out  # nothing drawn again
    assert "simulations on this machine's CPU" not in out, out  # nor simulated
    assert out.count("simulations: reusing ") == 2
    # from the checkpoint of an epoch after the first two (the Ctrl-C came after epoch 2's)
    assert re.search(r"^\[trainforge\] r1: .*resuming at epoch [3-6] step", out, re.M), out
    assert (run / "rounds" / "proposal-r1.pt").read_bytes() == proposal
    assert isinstance(load_posterior(run / "posterior.pt"), MCMCPosterior)
    record = json.loads((run / "rounds.json").read_text())
    assert [r["name"] for r in record["rounds"]] == ["snle-r0", "snle-r1"]
    assert all("c2st/mean" in r for r in record["rounds"])  # the kept round's, remembered

    runs, _ = _runs(in_tmp)
    assert sorted(runs) == ["snle", "snle-r0", "snle-r1"]  # the stopped ones resumed, not new
    assert runs["snle"].info.status == "FINISHED" and runs["snle-r1"].info.status == "FINISHED"

    # the same recipe uninterrupted ends with the same posterior, bitwise
    straight = subprocess.run(
        [*command(), "train", *NLE, "run.name=straight"], cwd=in_tmp, env=env_for(home),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert straight.returncode == 0, straight.stdout[-4000:] + straight.stderr[-3000:]
    resumed, uninterrupted = (torch.load(in_tmp / "runs" / name / "posterior.pt",
                                         weights_only=True)["state_dict"]
                              for name in ("snle", "straight"))  # fmt: skip
    assert resumed.keys() == uninterrupted.keys()
    for key, weights in uninterrupted.items():
        assert torch.equal(resumed[key], weights), key


USER_SIMULATOR = """
import torch
from torch.distributions import Independent, Uniform


def prior():
    return Independent(Uniform(-2 * torch.ones(2), 2 * torch.ones(2)), 1)


def simulate(theta):
    return theta + 0.3 * torch.randn_like(theta)
"""
CUSTOM = [
    "two_moons_debug", "run.name=user-seq", "workload.task=custom", "workload.prior=noisy:prior",
    "workload.simulator=noisy:simulate", "workload.evaluation.observations=[]",
    "workload.rounds=2", "workload.simulation.num_simulations=1000", "train.epochs=30",
]  # fmt: skip


def test_a_users_simulator_runs_rounds_focused_on_their_observed_x(
    home: Path, in_tmp: Path
) -> None:
    """A custom task's rounds: x_o from the user's .npy file (one of the wrong width refused
    in one line before anything starts), the second round's θ from the prior truncated to the
    first round's posterior there, simulated by the user's simulator."""
    import numpy as np

    (in_tmp / "noisy.py").write_text(USER_SIMULATOR)
    np.save(in_tmp / "wide.npy", np.zeros(3))
    refused = subprocess.run(
        [*command(), "train", *CUSTOM, "workload.evaluation.observed=wide.npy"], cwd=in_tmp,
        env=env_for(home), capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert refused.stderr.strip().splitlines()[-1] == (
        "trainforge: error: workload.evaluation.observed: wide.npy holds 3 values of shape (3,); "
        "the simulator's x has 2")  # fmt: skip
    assert not (in_tmp / "runs" / "user-seq").exists()

    np.save(in_tmp / "x_o.npy", np.array([0.5, -0.5]))
    done = subprocess.run([*command(), "train", *CUSTOM, "workload.evaluation.observed=x_o.npy"],
                          cwd=in_tmp, env=env_for(home), capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out[-4000:] + done.stderr[-3000:]
    said = re.search(r"sequential: round r1: 1,000 θ from the prior truncated to round "
                     r"user-seq-r0's posterior at the observed x in x_o.npy \(it keeps "
                     r"([\d.]+)% of the prior; judged on the CPU\)", out)  # fmt: skip
    assert said, out[-4000:]
    assert 0 < float(said.group(1)) < 90  # a region around x_o, not the whole box
    run = in_tmp / "runs" / "user-seq"
    proposal = torch.load(run / "rounds" / "proposal-r1.pt", weights_only=True)
    assert proposal.shape == (1000, 2) and bool((proposal.abs() <= 2).all())
    theta, x = simulations.load(run / "rounds" / "data-r1", drop_invalid=False)
    assert torch.equal(theta[1000:], proposal)  # round r1 simulated the θ drawn for it
    assert 0.25 < float((x - theta).std()) < 0.35  # by the user's simulator (noise 0.3)
    posterior = trainforge.load(run)
    samples = posterior.sample((500,), x=torch.tensor([[0.5, -0.5]]), show_progress_bars=False)
    assert torch.allclose(samples.mean(0), torch.tensor([0.5, -0.5]), atol=0.3)
