"""End to end through Ray Train on CPU workers (gloo): accuracy, image folders, out of memory
(what every worker group does on NaN, a restart, a Ctrl-C: test_worker_groups.py; accumulation
parity: test_own_training.py).

The tests in one test process share its local Ray instance (``ray_cluster``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from tests import faults
from trainforge import checkpoint, config
from trainforge.cli import main as cli_main
from trainforge.driver import launch
from trainforge.tracking.client import resolve_uri

pytestmark = [pytest.mark.ray, pytest.mark.slow]

DIGITS = Path(__file__).resolve().parents[2] / "recipes" / "cnn" / "digits_simple_cnn.yaml"


def _train(*overrides: str) -> launch.Outcome:
    return launch.train(config.load(DIGITS, list(overrides)))


def _params(outcome: launch.Outcome) -> dict[str, torch.Tensor]:
    assert outcome.checkpoint_path is not None
    return checkpoint.load(outcome.checkpoint_path)["model"]


def test_digits_two_workers_reach_95_percent(
    ray_cluster, in_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every worker began importing the run's modules at its start and stays where Ray
    # started it, or its loop fails
    faults.ask(monkeypatch)  # this checkout on the workers' Python path
    monkeypatch.setenv(faults.PLUGINS, "tests.ray_train_probe")
    outcome = _train("run.name=digits-acc", "scaling.num_workers=2")
    assert outcome.exit_code == 0
    assert (outcome.backend, outcome.num_workers) == ("gloo", 2)  # the workers' process group
    assert outcome.metrics["val/accuracy"] >= 0.95, outcome.metrics
    assert outcome.metrics["epoch"] == 15
    # Ray Train's start made no autoscaling coordinator for Ray Data (ray_compat says why)
    with pytest.raises(ValueError, match="Failed to look up actor"):
        ray_cluster.get_actor("AutoscalingCoordinator", namespace="AutoscalingCoordinator")

    # The run is in the embedded SQLite MLflow store, finished, with its curve and recipe.
    client = MlflowClient(tracking_uri=resolve_uri(None))
    run = client.get_run(outcome.mlflow_run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["train.lr"] == "0.002"
    history = client.get_metric_history(run.info.run_id, "val/accuracy")
    assert len(history) == 15 and history[-1].value >= 0.95
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"recipe.yaml", "plots", "model_state"} <= artifacts


def test_use_gpu_true_without_gpu_exits_2(ray_cluster, in_tmp: Path, capsys) -> None:
    code = cli_main(["train", str(DIGITS), "run.name=nogpu", "scaling.use_gpu=true"])
    assert code == 2
    err = capsys.readouterr().err
    assert "scaling.use_gpu" in err and "no GPU" in err
    assert not (in_tmp / "runs" / "nogpu").exists()


def test_imagefolder_through_dataloader_workers(ray_cluster, in_tmp: Path) -> None:
    """An ImageFolder tree goes through DataLoader worker processes (persistent, pinned where
    there is a GPU) with the runtime's sampler, on 2 Ray Train workers."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", 32), ("val", 8)):
        for label, channel in (("red", 0), ("blue", 2)):
            folder = in_tmp / "images" / split / label
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 90, (12, 12, 3), dtype=np.uint8)
                pixels[..., channel] = rng.integers(160, 255, (12, 12), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    outcome = _train(
        "run.name=folder", "scaling.num_workers=2", "train.epochs=3", "train.batch_size=8",
        "workload.dataset=imagefolder", f"workload.data_root={in_tmp / 'images'}",
        "workload.num_classes=2", "workload.loader_workers=2", "tracking.enabled=false",
    )  # fmt: skip
    assert outcome.exit_code == 0
    assert outcome.metrics["epoch"] == 3
    assert outcome.metrics["val/accuracy"] >= 0.9, outcome.metrics
    assert checkpoint.load(outcome.checkpoint_path)["global_step"] == 3 * (32 // 8)


def test_a_ray_process_starts_its_loader_workers_from_a_forkserver(ray_cluster) -> None:
    """Not by fork: a forked loader worker would share the Ray worker's gRPC connections. The
    server is running once the loader's context is made (its imports overlap the set-up), not
    only when the first batch is asked for."""
    from trainforge.data.sharding import loader_processes
    from trainforge.workloads.cnn.datasets import ImageFolderDataset

    @ray_cluster.remote(num_cpus=0, max_calls=1)  # a process of its own: no server yet
    def start_method() -> tuple[str | None, list[str]]:
        import psutil

        context = loader_processes(ImageFolderDataset([], [], 8))
        children = [" ".join(c.cmdline()) for c in psutil.Process().children()]
        return None if context is None else context.get_start_method(), children

    method, children = ray_cluster.get(start_method.remote())
    assert method == "forkserver"
    assert any("forkserver" in child for child in children), children


def test_the_jobs_processes_are_pinned_to_their_own_cluster(ray_cluster) -> None:
    # Ray Train's placement-group cleaner asks the State API whether the run's controller still
    # lives. Unpinned, that API asks the most recently started Ray on the machine (xdist runs
    # one per test process), misses the controller and removes a live run's placement group.
    ray = ray_cluster

    @ray.remote(num_cpus=0)
    class Probe:
        def look(self) -> tuple[str | None, str | None]:
            import os

            from ray.util.state import get_actor

            me = get_actor(ray.get_runtime_context().get_actor_id(), timeout=20)
            return os.environ.get("RAY_ADDRESS"), me.state if me else None

    address, state = ray.get(Probe.remote().look.remote())
    own_port = ray.get_runtime_context().gcs_address.rsplit(":", 1)[1]
    assert address == f"127.0.0.1:{own_port}"
    assert state == "ALIVE"  # the State API, from a job process, finds this cluster's actors


def test_out_of_memory_in_a_worker_is_one_line_and_the_checkpoints_stay(
    ray_cluster, in_tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rank 1 raises torch.OutOfMemoryError during step 30 (22 steps an epoch, a checkpoint
    after the first). Then the same run with another learning rate is refused before any
    worker starts, naming the key."""
    from trainforge.errors import RecipeError

    faults.ask(monkeypatch, **{faults.OOM_AT_STEP: "30"})
    common = [
        "run.name=oom",
        "scaling.num_workers=2",
        "train.epochs=2",
        "tracking.system_metrics=false",
    ]
    code = cli_main(["train", str(DIGITS), *common])
    assert code == 1
    err = capsys.readouterr().err
    failed = [line for line in err.splitlines() if line.startswith("[trainforge] training")]
    assert failed == [
        "[trainforge] training failed: out of CPU memory on rank 1: each of 2 workers runs "
        "train.batch_size 32 samples at a time, train.grad_accum_steps 1 times per step "
        "(global batch 64); lower train.batch_size and raise train.grad_accum_steps by the "
        "same factor (same global batch), or use precision.dtype=bf16; the same command then "
        "resumes from the last checkpoint"
    ], err[-3000:]
    client = MlflowClient(tracking_uri=resolve_uri(None))
    (run,) = client.search_runs(
        [client.get_experiment_by_name("trainforge").experiment_id],
        "tags.`trainforge.run_name` = 'oom'",
    )
    assert run.info.status == "FAILED"
    assert "out of CPU memory on rank 1" in run.data.tags["trainforge.failure"]
    found = checkpoint.newest_in(in_tmp / "runs" / "oom")  # the epoch-1 checkpoint, verified
    assert found.state is not None and found.state["global_step"] == 22 and not found.skipped
    assert not (in_tmp / "runs" / ".oom.lock").exists()  # the command's lock went with it

    monkeypatch.delenv(faults.OOM_AT_STEP)
    with pytest.raises(RecipeError, match=r"train\.lr 0\.002 -> 0\.01"):
        _train(*common, "train.lr=0.01")
