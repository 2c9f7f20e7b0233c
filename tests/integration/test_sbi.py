"""SBI end to end on the shared local Ray: the simulation stage's cache (reuse, resume after an
interruption, NaN handling), NPE on two_moons with 2 CPU workers through Ray Train scored by
C2ST and exported to sbi, and a user's simulator named by import path (streaming from disk to
two ranks: test_own_training.py)."""

from __future__ import annotations

import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient
from scipy import stats

import trainforge
from tests import faults
from trainforge import config
from trainforge.cli import main as cli_main
from trainforge.driver import launch, stage
from trainforge.errors import RecipeError
from trainforge.tracking.client import resolve_uri
from trainforge.workloads.sbi import load_posterior, simulate, simulating, simulations
from trainforge.workloads.sbi.tasks import get_task
from trainforge.workloads.stage import Tasks

pytestmark = [pytest.mark.ray, pytest.mark.slow]

DEBUG = Path(__file__).resolve().parents[2] / "recipes" / "sbi" / "two_moons_debug.yaml"
NLE_DEBUG = DEBUG.with_name("two_moons_nle_debug.yaml")

USER_SIMULATOR = '''
import torch

def prior():
    box = torch.distributions.Uniform(-2 * torch.ones(2), 2 * torch.ones(2))
    return torch.distributions.Independent(box, 1)

def simulate(theta):
    """A noisy sum and product; NaN where theta_0 > 1.5 (a solver that fails there)."""
    x = torch.stack([theta.sum(1), theta.prod(1)], dim=1) + 0.05 * torch.randn(len(theta), 2)
    x[theta[:, 0] > 1.5] = float("nan")
    return x

class Features(torch.nn.Module):
    """The user's own embedding net: x to ``width`` features."""

    def __init__(self, dim_x, width):
        super().__init__()
        self.width = width
        self.layers = torch.nn.Sequential(torch.nn.Linear(dim_x, width), torch.nn.Tanh())

    def forward(self, x):
        return self.layers(x)

def spline_flow(theta, x, embedding_net, transforms):
    """The user's own builder, as sbi takes one: sbi's NSF with settings of the user's."""
    from sbi.neural_nets.net_builders import build_nsf

    return build_nsf(theta, x, hidden_features=16, num_transforms=transforms,
                     embedding_net=embedding_net)
'''


STAGE = stage.Runner()  # the driver's stage runner, on this session's Ray


def _workload(*overrides: str) -> object:
    return config.load(DEBUG, list(overrides)).workload


def test_simulations_are_cached_and_an_interrupted_stage_resumes(ray_cluster, in_tmp) -> None:
    cfg = _workload(
        "workload.simulation.num_simulations=1200", "workload.simulation.chunk_size=400"
    )
    storage = str(in_tmp / "runs")
    folder = simulate.run(cfg, 0, storage, STAGE, quiet=True)
    chunks = sorted(folder.glob("chunk-*.pt"))
    assert [c.name for c in chunks] == [f"chunk-00000{i}.pt" for i in range(3)]
    assert simulations.read_manifest(folder)["invalid"] == 0
    theta, x = simulations.load(folder, drop_invalid=False)
    assert theta.shape == (1200, 2) and x.shape == (1200, 2)
    stamps = {c.name: c.stat().st_mtime_ns for c in chunks}

    assert simulate.run(cfg, 0, storage, STAGE, quiet=True) == folder  # reused
    assert {c.name: c.stat().st_mtime_ns for c in chunks} == stamps

    # an interruption after two chunks: the manifest and the third chunk never got written
    (folder / simulations.MANIFEST).unlink()
    chunks[1].unlink()
    assert simulate.run(cfg, 0, storage, STAGE, quiet=True) == folder
    after = {c.name: c.stat().st_mtime_ns for c in sorted(folder.glob("chunk-*.pt"))}
    assert after["chunk-000000.pt"] == stamps["chunk-000000.pt"]  # not simulated again
    assert after["chunk-000002.pt"] == stamps["chunk-000002.pt"]
    assert after["chunk-000001.pt"] != stamps["chunk-000001.pt"]
    theta_again, x_again = simulations.load(folder, drop_invalid=False)
    assert torch.equal(theta, theta_again) and torch.equal(x, x_again)  # seeded per chunk
    assert not list(folder.glob(".*tmp"))

    other = simulate.run(cfg, 1, storage, STAGE, quiet=True)
    assert other != folder and not torch.equal(simulations.load(other, False)[0], theta)


def _write_user_files(folder: Path, name: str) -> Path:
    (folder / f"{name}.py").write_text(USER_SIMULATOR)
    recipe = folder / "user.yaml"
    recipe.write_text(
        DEBUG.read_text()
        .replace(
            "task: two_moons", f"task: custom\n  prior: {name}:prior\n  simulator: {name}:simulate"
        )
        .replace("observations: [1]", "observations: []")
        .replace("name: two_moons_debug", "name: user-sim")
    )
    return recipe


def _prior_draws(manifest: dict, prior: torch.distributions.Distribution) -> torch.Tensor:
    """The θ the simulation stage must have drawn, by its contract and not by its code: chunk i
    of ``chunk_size`` rows (the last one what is left) seeds the global torch RNG, which a
    user's prior draws from, with SeedSequence([seed, i]) (63 bits)."""
    total, rows = manifest["num_simulations"], manifest["chunk_size"]
    draws = []
    with torch.random.fork_rng(devices=[]):  # the test's own seeding stays here
        for index, start in enumerate(range(0, total, rows)):
            state = np.random.SeedSequence([manifest["seed"], index]).generate_state(1, np.uint64)
            torch.manual_seed(int(state[0] >> 1))
            draws.append(prior.sample((min(rows, total - start),)).float())
    assert len(draws) == manifest["chunks"]
    return torch.cat(draws)


def test_nan_simulations_stop_the_run_unless_dropped(ray_cluster, in_tmp: Path, capsys) -> None:
    recipe = _write_user_files(in_tmp, "nan_sim")
    code = cli_main(["train", str(recipe), "workload.simulation.num_simulations=800"])
    assert code == 2
    error = capsys.readouterr().err
    assert "workload.simulation.drop_invalid=true" in error
    assert not (in_tmp / "runs" / "user-sim").exists()  # no worker started, nothing written

    cfg = config.load(recipe, ["workload.simulation.num_simulations=800"]).workload
    folder = simulate.run(cfg, 0, str(in_tmp / "runs"), STAGE, quiet=True)
    manifest = simulations.read_manifest(folder)
    # the expected count, from the seeded prior draws and the simulator's rule (NaN where
    # θ0 > 1.5: about 1/8 of 800, but exactly this many for this seed)
    user_code: dict = {}
    exec(USER_SIMULATOR, user_code)
    theta_drawn = _prior_draws(manifest, user_code["prior"]())
    expected = int((theta_drawn[:, 0] > 1.5).sum())
    assert f"{expected} of 800 simulations have NaN or inf in x" in error
    assert manifest["invalid"] == expected
    with pytest.raises(RecipeError, match=f"{expected} of 800"):
        simulations.load(folder, drop_invalid=False)
    theta, x = simulations.load(folder, drop_invalid=True)
    keep = theta_drawn[:, 0] <= 1.5
    assert torch.equal(theta, theta_drawn[keep])  # exactly the rows with θ0 ≤ 1.5 are kept
    assert len(theta) == 800 - expected and bool(torch.isfinite(x).all())
    sys.modules.pop("nan_sim", None)


def _sbc_pvalue(posterior: Any, runs: int, samples: int, seed: int = 10_007) -> float:
    """The smallest over θ's dimensions of the KS p-value of SBC ranks (posterior samples
    below the true θ, over ``samples``) against Uniform(0, 1)."""
    task = get_task("two_moons")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)  # the posterior's sampling
        generator = torch.Generator().manual_seed(seed)  # the task's prior and simulator
        theta = task.prior_sample(runs, generator)
        x = task.simulate(theta, generator)
        with warnings.catch_warnings():  # sbi caps its sampling batch for many x at once
            warnings.simplefilter("ignore", UserWarning)
            drawn = posterior.sample_batched((samples,), x=x, show_progress_bars=False)
    ranks = (drawn.transpose(0, 1) < theta.unsqueeze(1)).sum(dim=1).numpy()
    return min(stats.kstest(ranks[:, i] / samples, "uniform").pvalue for i in range(2))


def test_npe_on_two_workers_is_accurate_and_exports_to_sbi(ray_cluster, in_tmp: Path) -> None:
    outcome = launch.train(config.load(DEBUG, ["run.name=npe-2w"]))
    assert outcome.exit_code == 0
    metrics = outcome.metrics
    # a trained posterior, still far from converged at this budget; an untrained one scores ~1.0
    assert metrics["c2st/obs1"] < 0.9, metrics
    assert metrics["val/loss"] < -1.0, metrics
    assert (outcome.backend, outcome.num_workers) == ("gloo", 2)  # as the workers reported

    posterior = load_posterior(in_tmp / "runs" / "npe-2w" / "posterior.pt")
    # the SBC p-value is that of the exported posterior: ranks of 50 prior draws among 100
    # posterior samples each, drawn as the evaluation draws them (seed run.seed + 10,007)
    assert metrics["sbc/ks_pvalue_min"] == pytest.approx(_sbc_pvalue(posterior, 50, 100))
    _, x_obs = get_task("two_moons").observation(1)
    samples = posterior.sample((500,), x=x_obs, show_progress_bars=False)
    assert samples.shape == (500, 2) and bool(samples.abs().le(1).all())
    assert bool(torch.isfinite(posterior.log_prob(samples, x=x_obs)).all())

    client = MlflowClient(tracking_uri=resolve_uri(None))
    run = client.get_run(outcome.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["c2st/obs1"] == pytest.approx(metrics["c2st/obs1"])
    files = {a.path for a in client.list_artifacts(run.info.run_id, "evaluation")}
    assert {
        "evaluation/posterior.pt",
        "evaluation/pair_plot_obs1.png",
        "evaluation/sbc.png",
        "evaluation/sbc_ranks.png",
        "evaluation/tarp.png",
    } <= files
    assert -0.5 <= run.data.metrics["tarp/atc"] <= 0.5  # sbi's TARP on the SBC pairs
    assert len(client.get_metric_history(run.info.run_id, "val/loss")) == metrics["epoch"]


def test_nle_learns_exports_an_mcmc_posterior_and_resumes(
    ray_cluster, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``workload.method: nle`` through the command on 2 workers: its workers fail after epoch
    10's checkpoint, and the same command again resumes that run (one MLflow run, each epoch
    logged once, the first 10 untouched); the likelihood estimator learns, the export loads as
    sbi's MCMCPosterior, and C2ST through its MCMC scores far from an untrained posterior's
    ~1.0."""
    from sbi.inference import MCMCPosterior

    command = ["train", str(NLE_DEBUG), "run.name=nle-2w"]
    faults.ask(monkeypatch, **{faults.FAIL_AFTER_EPOCH: "10"})  # the recipe's first checkpoint
    assert cli_main(command) == 1
    client = MlflowClient(tracking_uri=resolve_uri(None))
    experiment = client.get_experiment_by_name("trainforge").experiment_id
    (failed,) = client.search_runs([experiment], "tags.`trainforge.run_name` = 'nle-2w'")
    before = client.get_metric_history(failed.info.run_id, "val/loss")
    assert failed.info.status == "FAILED" and len(before) == 10

    monkeypatch.delenv(faults.FAIL_AFTER_EPOCH)
    assert cli_main(command) == 0
    (run,) = client.search_runs([experiment], "tags.`trainforge.run_name` = 'nle-2w'")
    assert run.info.run_id == failed.info.run_id and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "val/loss")
    epochs = int(run.data.metrics["epoch"])
    assert len(history) == epochs > 10  # resumed at epoch 11: each epoch logged once
    key = lambda m: (m.step, m.value, m.timestamp)  # noqa: E731
    assert sorted(map(key, history))[:10] == sorted(map(key, before))  # epochs 1-10 untouched
    losses = [m.value for m in sorted(history, key=lambda m: m.step)]
    assert min(losses) < losses[0] - 1.0 and min(losses) < -3.0, losses  # it learns q(x | θ)
    c2st = run.data.metrics["c2st/obs1"]
    assert np.isfinite(c2st) and c2st < 0.8, c2st  # measured 0.60-0.65 here; untrained ~1.0

    posterior = trainforge.load(in_tmp / "runs" / "nle-2w")
    assert isinstance(posterior, MCMCPosterior) and posterior.warmup_steps == 50
    _, x_obs = get_task("two_moons").observation(1)
    samples = posterior.sample((100,), x=x_obs, show_progress_bars=False)
    assert samples.shape == (100, 2) and bool(samples.abs().le(1).all())
    files = {a.path for a in client.list_artifacts(run.info.run_id, "evaluation")}
    assert {"evaluation/posterior.pt", "evaluation/pair_plot_obs1.png"} <= files


def test_a_user_simulator_estimator_builder_and_embedding_net_by_import_path_train_end_to_end(
    ray_cluster, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    recipe = _write_user_files(in_tmp, "user_sim_e2e")
    outcome = launch.train(
        config.load(
            recipe,
            [
                "scaling.num_workers=1",
                "workload.simulation.drop_invalid=true",
                "train.epochs=5",
                "tracking.enabled=false",
                "workload.estimator.model=user_sim_e2e:spline_flow",
                "workload.estimator.model_kwargs.transforms=3",
                "workload.estimator.embedding=user_sim_e2e:Features",
                "workload.estimator.embedding_kwargs.width=6",
            ],
        )
    )
    assert outcome.exit_code == 0
    assert "sbc/ks_pvalue_min" in outcome.metrics

    # The export finds the user's prior again from anywhere (the driver recorded its folder);
    # trainforge.load of the run's folder is sbi's posterior
    elsewhere = in_tmp / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    sys.modules.pop("user_sim_e2e", None)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(in_tmp))])
    posterior = trainforge.load(in_tmp / "runs" / "user-sim")
    assert type(posterior).__name__ == "DirectPosterior"
    # the user's builder and embedding net, rebuilt from the run's record (folder, arguments)
    splines = [m for m in posterior.posterior_estimator.modules()
               if type(m).__name__ == "PiecewiseRationalQuadraticCouplingTransform"]  # fmt: skip
    assert len(splines) == 3
    modules = posterior.posterior_estimator.embedding_net.modules()
    [embedding] = [m for m in modules if type(m).__name__ == "Features"]
    assert embedding.width == 6
    samples = posterior.sample((50,), x=torch.tensor([0.5, 0.1]), show_progress_bars=False)
    assert samples.shape == (50, 2) and bool(samples.abs().le(2).all())
    sys.modules.pop("user_sim_e2e", None)


class _Holder:
    """Holds a CPU, as another run's worker would hold a GPU."""


def test_a_stage_on_processes_of_its_own_runs_its_tasks_there_on_what_is_free(
    ray_cluster, in_tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """A GPU stage's tasks run in one process per GPU for the whole stage (a GPU task of Ray's
    would get a new process each: torch's import and a CUDA context every time), ended with the
    stage so the run's workers get the GPUs; the same mechanism with CPUs here. Only on what is
    free: with one of the cluster's two CPUs held by other work, the stage goes on with one
    process (a process given tasks while it waits for a GPU that a training run holds would hold
    them up until that run ends); with both held it says what it waits for, and starts once one
    is free."""
    import threading

    import ray

    cfg = _workload("workload.simulation.num_simulations=600", "workload.simulation.chunk_size=100")

    def six_tasks(processes: int) -> tuple[set[str], list[int]]:
        """Six one-chunk tasks on a stage of up to ``processes``: (who simulated, their pids)."""
        with stage.stage_processes(processes, num_cpus=1, label="simulations") as members:
            work = Tasks(simulating.simulate_chunks, (cfg, 0, "cpu"), [], "cpu", 1,
                         lambda *_: lambda n: 1, lambda *_: None)  # fmt: skip
            launcher = stage.Launcher(work, members)
            tasks = [launcher.submit([(index, 100)]) for index in range(6)]
            workers = {worker for _, worker in ray.get(tasks, timeout=120)}
            pids = ray.get([m.__ray_call__.remote(lambda self: os.getpid()) for m in members])
        return {worker.rsplit(":", 1)[1] for worker in workers}, pids

    simulated_by, pids = six_tasks(2)
    assert simulated_by == {str(pid) for pid in pids} and len(set(pids)) == 2
    for pid in pids:  # ended with the stage
        deadline = time.monotonic() + 30
        while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not Path(f"/proc/{pid}").exists()

    holder = ray.remote(num_cpus=1)(_Holder).remote()
    ray.get(holder.__ray_ready__.remote())
    # where Ray's free count lags the holders, a process that cannot start is dropped sooner
    # than after 30 s (the stage's processes above may take seconds to start on 2 busy cores)
    monkeypatch.setattr(stage, "STAGE_PROCESS_START_S", 10.0)
    try:
        simulated_by, pids = six_tasks(2)
        assert len(pids) == 1 and simulated_by == {str(pids[0])}  # all six, on the free CPU
        capsys.readouterr()  # what the stages so far said
        other = ray.remote(num_cpus=1)(_Holder).remote()  # now both CPUs are held
        ray.get(other.__ray_ready__.remote())
        threading.Timer(2.0, ray.kill, [other]).start()  # the other work ends after a while
        simulated_by, pids = six_tasks(2)
        assert len(pids) == 1 and simulated_by == {str(pids[0])}
        said = capsys.readouterr().out
        assert said.count("simulations: waiting for CPUs that other work holds") == 1, said
    finally:
        ray.kill(holder)
