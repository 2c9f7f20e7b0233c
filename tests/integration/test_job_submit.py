"""Real clusters on this machine: `ray start --head` + `trainforge submit` (→ `ray job submit`),
which keeps the run in a real MLflow server and the checkpoints on the storage given, and
refuses the shipped defaults (a run folder and store in the job's temporary working_dir)
without submitting, and ships a user's project of its own (its workload's module) with the job;
and a cluster whose head trains nothing, with two worker nodes: its
2-worker run puts one worker on each.

Both submit from the checkout: the current directory is the project that ships as the
working_dir, and the recipe is a file inside it (tests/integration/test_packaging.py submits a
shipped recipe by name from an installed wheel and a project elsewhere)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from tests.integration.mlflow_server import MlflowServer
from tests.integration.ray_nodes import RayNodes
from trainforge.driver.submit import DEFAULT_RUNTIME_ENV, git_commit_of

pytestmark = [pytest.mark.ray, pytest.mark.slow]

PROJECT = Path(__file__).resolve().parents[2]  # the checkout, submitted from as the project
DIGITS = "recipes/cnn/digits_simple_cnn.yaml"  # a file inside the project, relative to it


def _nodes(tmp_path: Path, *head_args: str) -> RayNodes:
    return RayNodes(tmp_path).start_head(*head_args)


def _submit(
    nodes: RayNodes,
    tmp_path: Path,
    *overrides: str,
    ship: bool = True,
    system_metrics: bool = False,
    runtime_env: Path | None = None,
) -> subprocess.CompletedProcess:
    """The job's MLflow store: MLFLOW_TRACKING_URI of ``runtime_env``, else an absolute SQLite
    file."""
    flags = [] if ship else ["--no-working-dir"]
    tracking = [f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}"]
    if runtime_env is not None:
        flags, tracking = [*flags, "--runtime-env", str(runtime_env)], []
    command = [sys.executable, "-m", "trainforge", "submit", DIGITS, *overrides,
               f"run.storage_path={tmp_path / 'runs'}", *tracking,
               f"tracking.system_metrics={str(system_metrics).lower()}", *flags,
               "--address", nodes.dashboard]  # fmt: skip
    return _trainforge(nodes, command)


def _trainforge(nodes: RayNodes, command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, cwd=PROJECT, env=nodes.env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def _status(nodes: RayNodes, submission_id: str) -> str:
    return nodes.job_status(submission_id)


def _run(client: MlflowClient, name: str):
    experiment = client.get_experiment_by_name("trainforge")
    assert experiment is not None
    (run,) = client.search_runs(
        [experiment.experiment_id], f"tags.`trainforge.run_name` = '{name}'"
    )
    return run


def test_submit_keeps_the_run_in_mlflow_and_the_checkpoints_on_storage_or_refuses(
    tmp_path: Path,
) -> None:
    """The shipped defaults (./runs, no MLflow store) are refused in one line and nothing
    reaches the cluster; the shipped runtime env with MLFLOW_TRACKING_URI set to a server that
    answers, and an absolute run.storage_path, keep the run there and the checkpoints here."""
    nodes = RayNodes(tmp_path)
    server = MlflowServer(tmp_path / "mlflow")
    env_file = tmp_path / "runtime_env.yaml"  # the user's copy of the shipped one, edited
    commit = git_commit_of(PROJECT)  # now, not after the job: others may commit meanwhile
    unkept = [sys.executable, "-m", "trainforge", "submit", DIGITS, "run.name=unkept",
              "--address", nodes.dashboard]  # fmt: skip
    try:
        with ThreadPoolExecutor(1) as pool:  # the head and the server take seconds each
            head = pool.submit(nodes.start_head, "--num-cpus=2")
            try:
                server.start()
                shipped = yaml.safe_load(DEFAULT_RUNTIME_ENV.read_text())
                shipped["env_vars"]["MLFLOW_TRACKING_URI"] = server.url
                env_file.write_text(yaml.safe_dump(shipped))
                head.result()
                refused = _trainforge(nodes, unkept)
                assert refused.returncode == 2, refused.stdout + refused.stderr
                (line,) = refused.stderr.splitlines()
                assert line.startswith("trainforge: error: run.storage_path './runs' is relative")
                assert "no MLflow store is set for the job" in line
                assert "does not exist" in _status(nodes, "unkept")  # never submitted
                done = _submit(nodes, tmp_path, "run.name=submitted", "train.epochs=2",
                               "scaling.num_workers=1", runtime_env=env_file)  # fmt: skip
                assert done.returncode == 0, done.stdout + done.stderr
                assert _status(nodes, "submitted") == "SUCCEEDED"
                # a user's project of its own, outside the repository: its modules travel
                # with the job (the working_dir) and the job (its simulations' Ray tasks too)
                # imports them there; wave on its recipe's 2 CPU workers (the head's 2 CPUs:
                # the entrypoint takes none)
                for example, *short in [
                    ("wave", "train.epochs=1", "scaling.num_workers=2"),
                    ("oscillator", "train.epochs=1", "workload.simulation.num_simulations=2000",
                     "workload.simulation.chunk_size=1000", "workload.evaluation.sbc_runs=10",
                     "scaling.num_workers=1"),
                ]:  # fmt: skip
                    project = tmp_path / f"{example}-project"
                    shutil.copytree(PROJECT / "examples" / example, project)
                    submitted = subprocess.run(
                        [sys.executable, "-m", "trainforge", "submit", "recipe.yaml",
                         f"run.name={example}", *short,
                         f"run.storage_path={tmp_path / 'runs'}", "--runtime-env", str(env_file),
                         "--address", nodes.dashboard],
                        cwd=project, env=nodes.env, capture_output=True, text=True, timeout=600,
                    )  # fmt: skip
                    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
                    assert _status(nodes, example) == "SUCCEEDED"
            finally:
                head.exception()  # a head that is still starting has registered its process
                nodes.stop()
        folder = tmp_path / "runs" / "submitted"
        checkpoints = [p for p in folder.glob("checkpoint_*") if p.is_dir()]
        assert checkpoints and all((c / "state.pt").is_file() for c in checkpoints), checkpoints
        client = MlflowClient(server.url)
        run = _run(client, "submitted")
        assert run.info.status == "FINISHED"
        assert run.data.tags["ray.submission_id"] == "submitted"  # one identity: job = run name
        assert run.data.tags["git.commit"] == commit  # the project's: the checkout, submitted from
        assert [m.value for m in client.get_metric_history(run.info.run_id, "epoch")] == [1, 2]
        wave_run = _run(client, "wave")
        assert wave_run.info.status == "FINISHED"
        assert wave_run.data.params["workload.entry"] == "wave_task:WaveRegression"
        assert "val/rmse" in wave_run.data.metrics
        assert wave_run.data.tags["world_size"] == "2"
        oscillator_run = _run(client, "oscillator")
        assert oscillator_run.info.status == "FINISHED"
        assert oscillator_run.data.params["workload.simulator"] == "oscillator:simulate"
        assert "sbc/ks_pvalue_min" in oscillator_run.data.metrics
    finally:
        server.stop()


def test_two_worker_nodes_take_one_worker_each_and_rank_0_tracks_from_its_node(
    tmp_path: Path,
) -> None:
    """The layout KubeRay recommends: a head that trains nothing (the command runs there)
    and worker nodes. Rank 0 is on another node than the command: it sends its own records
    and logs the model; each node's first worker takes the run handed over through Ray and
    samples its system metrics."""
    nodes = _nodes(tmp_path, "--num-cpus=0")
    try:
        nodes.add_node("--num-cpus=1", '--resources={"node1": 1}')
        nodes.add_node("--num-cpus=1", '--resources={"node2": 1}')
        assert nodes.node_count() == 3
        spread = "scaling.placement_strategy=STRICT_SPREAD"  # one worker per node, or fail
        # Raylets on one machine share one session folder, and each garbage-collects
        # working_dir copies the other still uses: the project is installed here, ship nothing.
        done = _submit(nodes, tmp_path, "run.name=two-nodes", "train.epochs=2",
                       "scaling.num_workers=2", spread, "tracking.system_metrics_interval_s=0.5",
                       ship=False, system_metrics=True)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert _status(nodes, "two-nodes") == "SUCCEEDED", done.stdout[-3000:]
    finally:
        nodes.stop()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = _run(client, "two-nodes")
    assert run.info.status == "FINISHED"
    assert run.data.tags["node_count"] == "2" and run.data.tags["world_size"] == "2"
    checkpoints = [p for p in (tmp_path / "runs" / "two-nodes").glob("checkpoint_*") if p.is_dir()]
    assert checkpoints and all((c / "state.pt").is_file() for c in checkpoints)
    assert [m.value for m in client.get_metric_history(run.info.run_id, "epoch")] == [1, 2]
    # both nodes' first workers sampled, as node_0: raylets of one host share its node rank
    sampled = {key.split("/")[1] for key in run.data.metrics if key.startswith("system/")}
    assert sampled == {"node_0"}, sorted(run.data.metrics)
    logged = client.search_logged_models(
        [run.info.experiment_id], f"source_run_id = '{run.info.run_id}'")  # fmt: skip
    assert [m.name for m in logged] == ["simple_cnn"]
