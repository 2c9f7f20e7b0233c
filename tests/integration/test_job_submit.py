"""Real clusters on this machine: `ray start --head` + `trainforge submit` (→ `ray job submit`),
and a cluster whose head trains nothing, with two worker nodes: its 2-worker run puts one
worker on each.

Both submit from the checkout: the current directory is the project that ships as the
working_dir, and the recipe is a file inside it (tests/integration/test_packaging.py submits a
shipped recipe by name from an installed wheel and a project elsewhere)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.integration.ray_nodes import RayNodes
from trainforge.driver.submit import git_commit_of

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
) -> subprocess.CompletedProcess:
    flags = [] if ship else ["--no-working-dir"]
    command = [sys.executable, "-m", "trainforge", "submit", DIGITS, *overrides,
               f"run.storage_path={tmp_path / 'runs'}",
               f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
               f"tracking.system_metrics={str(system_metrics).lower()}", *flags,
               "--address", nodes.dashboard]  # fmt: skip
    return subprocess.run(command, cwd=PROJECT, env=nodes.env, capture_output=True,
                          text=True, timeout=600)  # fmt: skip


def _status(nodes: RayNodes, submission_id: str) -> str:
    return nodes.job_status(submission_id)


def _run(tmp_path: Path, name: str):
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("trainforge")
    assert experiment is not None, sorted(p.name for p in tmp_path.iterdir())
    (run,) = client.search_runs(
        [experiment.experiment_id], f"tags.`trainforge.run_name` = '{name}'"
    )
    return run


def test_ray_job_submit_runs_a_recipe(tmp_path: Path) -> None:
    nodes = _nodes(tmp_path, "--num-cpus=2")
    commit = git_commit_of(PROJECT)  # now, not after the job: others may commit meanwhile
    try:
        done = _submit(nodes, tmp_path, "run.name=submitted", "train.epochs=2",
                       "scaling.num_workers=1")  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        assert _status(nodes, "submitted") == "SUCCEEDED"
    finally:
        nodes.stop()
    run = _run(tmp_path, "submitted")
    assert run.info.status == "FINISHED"
    assert run.data.tags["ray.submission_id"] == "submitted"  # one identity: job = run name
    assert run.data.tags["git.commit"] == commit  # the project's: the checkout, submitted from
    assert [m.value for m in MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
            .get_metric_history(run.info.run_id, "epoch")] == [1, 2]  # fmt: skip


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
    run = _run(tmp_path, "two-nodes")
    assert run.info.status == "FINISHED"
    assert run.data.tags["node_count"] == "2" and run.data.tags["world_size"] == "2"
    checkpoints = [p for p in (tmp_path / "runs" / "two-nodes").glob("checkpoint_*") if p.is_dir()]
    assert checkpoints and all((c / "state.pt").is_file() for c in checkpoints)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert [m.value for m in client.get_metric_history(run.info.run_id, "epoch")] == [1, 2]
    # both nodes' first workers sampled, as node_0: raylets of one host share its node rank
    sampled = {key.split("/")[1] for key in run.data.metrics if key.startswith("system/")}
    assert sampled == {"node_0"}, sorted(run.data.metrics)
    assert [m.name for m in client.search_logged_models(
        [run.info.experiment_id], f"source_run_id = '{run.info.run_id}'")] == ["model"]  # fmt: skip
