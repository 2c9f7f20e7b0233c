"""trainforge.tracking.datasets: the training data as an MLflow dataset input (name, digest,
size) on a real SQLite MLflow run, the workloads' identities of their data (a digest that
follows what makes the data and never reads them), and the spool's replay of one."""

from __future__ import annotations

import json
import multiprocessing
import re
from pathlib import Path
from typing import Any

import torch
from mlflow.tracking import MlflowClient

from trainforge import config
from trainforge.distributed import WorkerContext
from trainforge.tracking import driver
from trainforge.tracking.datasets import TrainingData, digest_of
from trainforge.tracking.spool import replay
from trainforge.tracking.worker import WorkerTracker
from trainforge.workloads.cnn.checks import train_samples
from trainforge.workloads.cnn.workload import CNNWorkload
from trainforge.workloads.sbi import simulate, simulating, simulations, sources
from trainforge.workloads.sbi.workload import SBIWorkload

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "recipes" / "cnn" / "digits_simple_cnn.yaml"
SBI_DEBUG = REPO / "recipes" / "sbi" / "two_moons_debug.yaml"
CPU = torch.device("cpu")
MAIN = WorkerContext(rank=0, local_rank=0, world_size=1, node_rank=0, device=CPU)


def _tracked(tmp_path: Path, uri: str | None = None) -> tuple[config.Recipe, dict]:
    uri = uri or f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = config.load(DIGITS, [f"run.storage_path={tmp_path}", f"tracking.tracking_uri={uri}",
                               "tracking.system_metrics=false"])  # fmt: skip
    handle = driver.start_run(
        cfg.tracking, "t", config.to_container(cfg), config.to_yaml(cfg), str(tmp_path / "s.jsonl")
    )
    return cfg, handle.for_workers()


def _digits(seed: int, *overrides: str) -> CNNWorkload:
    cfg = config.load(DIGITS, list(overrides))
    workload = CNNWorkload(cfg.workload, seed=seed)  # type: ignore[arg-type]
    workload.datasets(CPU)
    return workload


def test_the_training_data_is_the_runs_dataset_input(tmp_path: Path) -> None:
    cfg, handle = _tracked(tmp_path)
    data = _digits(0).training_data()
    tracker = WorkerTracker(handle, cfg.tracking, MAIN)
    tracker.start()
    tracker.log_training_data(data)
    tracker.log_training_data(data)  # a restarted worker group logs it again: still one input
    tracker.close()

    run = MlflowClient(handle["tracking_uri"]).get_run(handle["run_id"])
    (logged,) = run.inputs.dataset_inputs
    rows = train_samples(cfg.workload)  # type: ignore[arg-type]
    assert rows is not None and rows > 1000
    assert (logged.dataset.name, logged.dataset.digest) == ("digits", data.digest)
    assert re.fullmatch("[0-9a-f]{8}", data.digest)  # 8 hex digits, like mlflow.data digests
    profile = json.loads(logged.dataset.profile)
    assert profile["num_rows"] == rows and profile["shape"] == [1, 32, 32]
    assert profile["val_rows"] == 1797 - rows
    assert [(t.key, t.value) for t in logged.tags] == [("mlflow.data.context", "training")]


def test_other_ranks_log_no_dataset_input(tmp_path: Path) -> None:
    cfg, handle = _tracked(tmp_path)
    other = WorkerContext(rank=1, local_rank=1, world_size=2, node_rank=0, device=CPU)
    WorkerTracker(handle, cfg.tracking, other).log_training_data(_digits(0).training_data())
    run = MlflowClient(handle["tracking_uri"]).get_run(handle["run_id"])
    assert not run.inputs.dataset_inputs


def test_the_digest_follows_what_makes_the_data() -> None:
    first = _digits(0).training_data()
    assert _digits(0).training_data() == first  # same data: same digest, in another process too
    assert first.digest == digest_of(
        {"dataset": "digits", "rows": first.rows, "val_rows": 1797 - first.rows,
         "shape": [1, 32, 32], "classes": 10, "seed": 0, "val_fraction": 0.2}
    )  # fmt: skip
    assert _digits(1).training_data().digest != first.digest  # another split
    other_split = _digits(0, "workload.val_fraction=0.3").training_data()
    assert other_split.digest != first.digest and other_split.rows < first.rows
    synthetic = ["workload.dataset=synthetic", "workload.synthetic_train_size=64",
                 "workload.synthetic_val_size=16", "workload.image_size=8"]  # fmt: skip
    made = _digits(0, *synthetic).training_data()
    assert (made.name, made.rows, made.source_type) == ("synthetic", 64, "code")
    bigger = _digits(0, *synthetic, "workload.synthetic_train_size=65").training_data()
    assert bigger.digest != made.digest


def _simulate(tmp_path: Path, seed: int, *overrides: str) -> tuple[config.Recipe, Path]:
    """A cache entry as the simulation stage writes it (chunks and a manifest with its key),
    simulated in this process instead of Ray tasks."""
    cfg = config.load(SBI_DEBUG, ["workload.simulation.num_simulations=600",
                                  "workload.simulation.chunk_size=250", *overrides])  # fmt: skip
    section = cfg.workload
    job = simulate.plan(section, sources.resolve(section), seed, tmp_path / "sims", "cpu")
    job.folder.mkdir(parents=True, exist_ok=True)
    for index, size in job.chunks:
        chunk = simulating.simulate_chunk(section, seed, index, size, "cpu")
        torch.save(chunk, job.chunk_path(index))
    simulate.finish(job, {})
    section.simulation.path = str(job.folder)  # type: ignore[attr-defined]
    return cfg, job.folder


def _sbi_data(cfg: config.Recipe, seed: int) -> TrainingData:
    workload = SBIWorkload(cfg.workload, seed=seed)  # type: ignore[arg-type]
    workload.datasets(CPU)
    return workload.training_data()


def test_sbi_names_the_task_and_digests_the_simulation_cache_without_reading_it(
    tmp_path: Path,
) -> None:
    cfg, folder = _simulate(tmp_path, seed=0)
    data = _sbi_data(cfg, seed=0)
    assert (data.name, data.rows, data.source, data.source_type) == (
        "two_moons", 540, str(folder), "local",
    )  # fmt: skip
    assert data.profile == {"val_rows": 60, "num_simulations": 600, "invalid": 0,
                            "dim_theta": 2, "dim_x": 2}  # fmt: skip
    key = simulations.read_manifest(folder)["key"]
    assert key in folder.name
    assert data.digest == digest_of(
        {"simulations": key, "num_simulations": 600, "drop_invalid": False,
         "val_fraction": 0.1, "split_seed": 0}
    )  # fmt: skip

    workload = SBIWorkload(cfg.workload, seed=0)  # type: ignore[arg-type]
    workload.datasets(CPU)
    for chunk in folder.glob("chunk-*.pt"):
        chunk.unlink()  # the digest needs none of the rows
    assert workload.training_data() == data
    other_seed, _ = _simulate(tmp_path, seed=1)  # other simulations (and another split)
    assert _sbi_data(other_seed, seed=1).digest != data.digest


def test_a_spooled_dataset_input_is_replayed(tmp_path: Path) -> None:
    cfg, handle = _tracked(tmp_path, uri="http://127.0.0.1:9")  # nothing answers: spooled
    assert handle["run_id"] is None
    data = _digits(0).training_data()
    tracker = WorkerTracker(handle, cfg.tracking, MAIN)
    tracker.start()
    tracker.log_training_data(data)
    uri = f"sqlite:///{tmp_path / 'later.db'}"
    counts = replay(handle["spool_path"], tracking_uri=uri)
    assert counts["dataset"] == 1
    client = MlflowClient(uri)
    (run,) = client.search_runs([client.get_experiment_by_name(handle["experiment"]).experiment_id])
    (logged,) = client.get_run(run.info.run_id).inputs.dataset_inputs
    assert (logged.dataset.name, logged.dataset.digest) == ("digits", data.digest)
    assert json.loads(logged.dataset.profile)["num_rows"] == data.rows


def _log_at_once(uri: str, run_id: str, barrier: Any, failures: Any) -> None:
    """One of several processes: log the same data into its run once all are ready."""
    client = MlflowClient(uri)
    barrier.wait()
    try:
        TrainingData.of("digits", {"seed": 0}, 1437, "sklearn").log(client, run_id)
    except Exception as exc:
        failures.put(f"{type(exc).__name__}: {exc}")


def test_runs_logging_the_same_data_at_once_each_get_it(tmp_path: Path) -> None:
    """Two commands on one recipe: their ranks 0 log the same dataset into one experiment at
    the same moment. MLflow's store fails all but one of the inserts; each run still gets its
    input (without the retry, 3 rounds of 4 processes failed in nearly every round)."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    processes = multiprocessing.get_context("fork")
    failures = processes.Queue()
    for round_ in range(3):
        experiment = client.create_experiment(f"round-{round_}")
        runs = [client.create_run(experiment).info.run_id for _ in range(4)]
        barrier = processes.Barrier(len(runs))
        started = [processes.Process(target=_log_at_once, args=(uri, run, barrier, failures))
                   for run in runs]  # fmt: skip
        for process in started:
            process.start()
        for process in started:
            process.join(60)
        assert [process.exitcode for process in started] == [0] * len(runs)
        assert failures.empty(), failures.get()
        for run in runs:
            (logged,) = client.get_run(run).inputs.dataset_inputs
            assert logged.dataset.name == "digits"
