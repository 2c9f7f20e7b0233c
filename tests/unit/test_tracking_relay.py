"""trainforge.tracking.relay: rank 0 writes its records to the run folder and imports no MLflow;
the command's thread sends them into a real SQLite MLflow run as they come, and logs the final
model rank 0 keeps for it (a module; SBI's posterior pyfunc); what it cannot send goes to the
spool; what a killed command left is sent by the next from where it stopped."""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pytest
import torch
from mlflow.tracking import MlflowClient

from tests.integration.mlflow_server import free_port
from trainforge import config
from trainforge.tracking import driver, model_logging, relay
from trainforge.tracking.client import RUNS_FILE, RunHandle, configure_client_env
from trainforge.tracking.spool import SPOOL_FILE, Spool, replay

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "recipes" / "cnn" / "digits_simple_cnn.yaml"

# Rank 0 of a relayed run, in a new process (this one has MLflow imported): everything a run
# logs, then whether MLflow was imported for it; the model it keeps for the command beside the
# relay's files
RANK_0 = """
import json, sys
from pathlib import Path
import torch
from trainforge import config
from trainforge.distributed import WorkerContext
from trainforge.tracking.datasets import TrainingData
from trainforge.tracking.worker import WorkerTracker

handle, recipe, folder = json.loads(sys.argv[1])
cfg = config.from_container(recipe)
tracker = WorkerTracker(handle, cfg.tracking, WorkerContext(0, 0, 1, 0, torch.device("cpu")))
tracker.prewarm()
tracker.start()
tracker.log_training_data(TrainingData.of("digits", {"seed": 0}, 1437, "sklearn"))
for step in (1, 2):
    tracker.log({"train/loss": 2.0 / step}, step)
    tracker.commit()  # as a checkpoint does
plot = Path(folder) / "curve.png"
plot.write_bytes(b"png")
tracker.log_artifacts([plot], "plots")
tracker.log({"train/loss": 0.5, "val/accuracy": 0.75, "perf/elapsed_s": 1.5}, 3)
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
tracker.log_model(model, torch.zeros(2, 1, 8, 8), name="simple_cnn")
tracker.close()
print(json.dumps({"mlflow": "mlflow" in sys.modules, "monitor": tracker.system_monitor is None,
                  "warming": tracker._warming is None}))
"""


def _run(tmp_path: Path, *overrides: str) -> tuple[config.Recipe, RunHandle]:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = config.load(DIGITS, [f"run.storage_path={tmp_path}", f"tracking.tracking_uri={uri}",
                               *overrides])  # fmt: skip
    spool = tmp_path / "runs" / "r" / SPOOL_FILE
    handle = driver.start_run(cfg.tracking, "r", config.to_container(cfg), "", str(spool))
    return cfg, handle


def _for_workers(
    tmp_path: Path, *overrides: str
) -> tuple[config.Recipe, RunHandle, Callable[[], RunHandle]]:
    """A run as the command starts one beside its own workers: the handle rank 0 is given (no
    run yet; the relay file), and the run's start, for ``RunInTheMaking``."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = config.load(DIGITS, [f"run.storage_path={tmp_path}", f"tracking.tracking_uri={uri}",
                               *overrides])  # fmt: skip
    spool = tmp_path / "runs" / "r" / SPOOL_FILE
    relay_file = str(relay.relay_path(spool.parent))
    for_workers = RunHandle(uri, "trainforge", "r", None, False, str(spool), relay_file)
    return cfg, for_workers, lambda: driver.start_run(cfg.tracking, "r", {}, "", str(spool))


def test_rank_0_imports_no_mlflow_and_the_command_sends_all_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 writes before the run exists (the command makes it on a thread: here once rank 0
    has written its first record); all of it arrives."""
    cfg, for_workers, start_run = _for_workers(tmp_path, "tracking.system_metrics_interval_s=0.2")
    run_dir = tmp_path / "runs" / "r"
    written = Path(str(for_workers.relay_path))

    def make_once_rank_0_wrote() -> RunHandle:
        deadline = time.monotonic() + 100
        while not written.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return start_run()

    making = relay.RunInTheMaking(
        make_once_rank_0_wrote, for_workers, 0.2, ("torch", "mlflow.pytorch")
    )
    making.start()  # before rank 0, as a run does

    arguments = json.dumps([for_workers.for_workers(), config.to_container(cfg), str(tmp_path)])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rank_0 = subprocess.run([sys.executable, "-c", RANK_0, arguments], capture_output=True,
                            text=True, timeout=120, env=env)  # fmt: skip
    assert rank_0.returncode == 0, rank_0.stderr
    # no MLflow import, no prewarm thread, no system-metrics monitor in rank 0
    assert json.loads(rank_0.stdout) == {"mlflow": False, "monitor": True, "warming": True}
    handle, sending = making.made()
    assert handle is not None and handle.run_id is not None and sending is not None
    assert handle.relay_path == str(run_dir / relay.RELAY_FILE)
    kept = relay.files_folder(run_dir / relay.RELAY_FILE) / relay.HANDED_MODEL
    model, example, custom, record = pickle.loads(kept.read_bytes())
    sending.log_kept_model()
    assert custom is None and record.name == "simple_cnn" and record.step == 3
    making.stop()

    client = MlflowClient(handle.tracking_uri)
    run = client.get_run(handle.run_id)
    history = client.get_metric_history(handle.run_id, "train/loss")
    assert [(m.step, m.value) for m in history] == [(1, 2.0), (2, 1.0), (3, 0.5)]
    assert run.data.tags["world_size"] == "1" and run.data.tags["device"] == "cpu"
    assert [i.dataset.name for i in run.inputs.dataset_inputs] == ["digits"]
    assert [a.path for a in client.list_artifacts(handle.run_id, "plots")] == ["plots/curve.png"]
    state = client.download_artifacts(handle.run_id, "model_state/state_dict.pt", str(tmp_path))
    assert torch.load(state, weights_only=True).keys() == model.state_dict().keys()
    loaded = the_logged_model(handle.tracking_uri, run, monkeypatch)
    torch.testing.assert_close(loaded(torch.from_numpy(example)), model(torch.from_numpy(example)))
    # named after the workload's model, the run's output at its last step, linked to the
    # evaluation's metrics, not to training's, performance's or the system's
    [logged] = mlflow.search_logged_models(experiment_ids=[run.info.experiment_id],
                                           output_format="list")  # fmt: skip
    assert logged.name == "simple_cnn"
    assert [(m.key, m.step, m.value) for m in logged.metrics] == [("val/accuracy", 3, 0.75)]
    assert [m.step for m in run.outputs.model_outputs] == [3]
    # the logged model's source is the run's (a warm worker's is Ray's default_worker.py)
    assert {key: logged.tags.get(key) for key in model_logging.SOURCE_TAGS} == {
        key: run.data.tags.get(key) for key in model_logging.SOURCE_TAGS
    }
    # the command sampled the system as node 0
    assert any(key.startswith("system/node_0/") for key in run.data.metrics), run.data.metrics
    # all sent: nothing of the relay is left in the run folder, nothing spooled; which MLflow
    # run the folder records into is kept
    assert sorted(p.name for p in run_dir.iterdir()) == [RUNS_FILE]


def test_records_mlflow_did_not_take_are_spooled_for_tracking_sync(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    configure_client_env()  # one short attempt, as in a run
    _, reachable = _run(tmp_path)
    run_dir = tmp_path / "runs" / "r"
    down = RunHandle(f"http://127.0.0.1:{free_port()}", "trainforge", "r", reachable.run_id,
                     False, reachable.spool_path)  # fmt: skip
    sending = relay.start(down, run_dir, system_metrics_s=None)
    records = Spool(down.relay_path or "", reachable.identity())
    # a file gone from under its record is said and left out, not taken for MLflow's failure
    records.write("artifact", local_path=str(tmp_path / "gone.png"), artifact_path="plots")
    records.write("metrics", metrics=[["epoch", 1.0, 1000, 10], ["epoch", 2.0, 2000, 20]])
    records.write("tags", tags={"device": "cpu"})
    sending.stop()

    err = capsys.readouterr().err
    assert "gone.png was not in" in err
    assert err.count("stopped answering") == 1 and "2 tracking records could not be sent" in err
    assert not (run_dir / relay.RELAY_FILE).exists()
    counts = replay(run_dir / SPOOL_FILE, tracking_uri=reachable.tracking_uri)
    assert counts == {"metrics": 1, "tags": 1}
    client = MlflowClient(reachable.tracking_uri)
    assert [m.value for m in client.get_metric_history(reachable.run_id, "epoch")] == [1.0, 2.0]


def test_what_a_killed_command_left_unsent_is_sent_once_or_spooled(tmp_path: Path) -> None:
    _, handle = _run(tmp_path)
    run_dir = tmp_path / "runs" / "r"
    path = relay.relay_path(run_dir)
    records = Spool(path, handle.identity())
    for epoch in (1, 2, 3):
        records.write("metrics", metrics=[["epoch", float(epoch), epoch, epoch]])
    first = len(path.read_bytes().splitlines(keepends=True)[0])
    relay.offset_path(path).write_text(str(first))  # the killed command had sent epoch 1 only

    # the next command's relay sends from where the last one stopped …
    sending = relay.start(handle, run_dir, system_metrics_s=None)
    sending.stop()
    client = MlflowClient(handle.tracking_uri)
    assert [m.value for m in client.get_metric_history(handle.run_id, "epoch")] == [2.0, 3.0]
    assert not path.exists() and not relay.offset_path(path).exists()

    # … and a command whose run was never made (MLflow down) spools it
    for epoch in (1, 2, 3):
        records.write("metrics", metrics=[["loss", float(epoch), epoch, epoch]])
    first = len(path.read_bytes().splitlines(keepends=True)[0])
    relay.offset_path(path).write_text(str(first))
    assert relay.spool_rest(path, run_dir / SPOOL_FILE) == 2
    spooled = [json.loads(line) for line in (run_dir / SPOOL_FILE).read_text().splitlines()]
    assert [r["metrics"][0][1] for r in spooled] == [2.0, 3.0]
    assert not path.exists() and not relay.offset_path(path).exists()


def test_steps_a_killed_command_left_unsent_are_not_sent_again_from_the_resumed_attempt(
    tmp_path: Path,
) -> None:
    """A command killed in epoch 3 left epoch 2's metrics unsent in the relay file, and the
    next one resumes from epoch 1's checkpoint (epoch 2's turned out corrupt): the leftover is
    sent as it was, and the resumed attempt's rows of those steps are not sent again."""
    _, for_workers, start_run = _for_workers(tmp_path)
    start_run()  # the run exists, with nothing logged yet
    records = Spool(str(for_workers.relay_path), for_workers.identity())
    records.write("metrics", metrics=[["loss", 2.0, 1, 20], ["loss", 1.5, 2, 30]])  # left over
    making = relay.RunInTheMaking(start_run, for_workers, None, ())
    records.write("metrics", metrics=[["loss", 2.0, 3, 20], ["loss", 1.5, 4, 30],
                                      ["loss", 1.0, 5, 40]])  # the resumed attempt's  # fmt: skip
    making.start()
    handle, sending = making.made()
    assert handle is not None and sending is not None
    making.stop()
    client = MlflowClient(for_workers.tracking_uri)
    history = client.get_metric_history(str(handle.run_id), "loss")
    assert sorted((m.step, m.timestamp) for m in history) == [(20, 1), (30, 2), (40, 5)]


def test_records_rank_0_wrote_before_a_late_making_are_this_commands_own(tmp_path: Path) -> None:
    """The warm tracker may begin making the run after rank 0 has written (its call is not
    awaited): the relay file's size the command measured before its workers started says where
    an earlier command's leftover ends, so a restart's ``run/restarts``, logged at the step the
    restart resumes from, is not taken for a step sent already."""
    _, for_workers, start_run = _for_workers(tmp_path)
    records = Spool(str(for_workers.relay_path), for_workers.identity())
    left = relay.size(Path(str(for_workers.relay_path)))  # the command's, before its workers
    records.write("metrics", metrics=[["loss", 2.0, 1, 10], ["loss", 1.5, 2, 89]])  # attempt 1
    making = relay.RunInTheMaking(start_run, for_workers, None, (), leftover_end=left)
    records.write("metrics", metrics=[["run/restarts", 1.0, 3, 89], ["loss", 1.0, 4, 100]])
    making.start()
    handle, sending = making.made()
    assert handle is not None and sending is not None
    making.stop()
    client = MlflowClient(for_workers.tracking_uri)
    restarts = client.get_metric_history(str(handle.run_id), "run/restarts")
    assert [(m.step, m.value) for m in restarts] == [(89, 1.0)]
    loss = client.get_metric_history(str(handle.run_id), "loss")
    assert sorted(m.step for m in loss) == [10, 89, 100]


# Rank 0 of a relayed SBI run: the posterior's pyfunc prepared and handed over
SBI_RANK_0 = """
import json, sys
from pathlib import Path
import torch
from tests.unit.sbi_helpers import _data
from trainforge import config
from trainforge.distributed import WorkerContext
from trainforge.tracking.worker import WorkerTracker
from trainforge.workloads.sbi.config import SBIWorkloadConfig
from trainforge.workloads.sbi.workload import SBIWorkload

handle, recipe, folder = json.loads(sys.argv[1])
cfg = config.from_container(recipe)
tracker = WorkerTracker(handle, cfg.tracking, WorkerContext(0, 0, 1, 0, torch.device("cpu")))
theta, x = _data()
workload = SBIWorkload(SBIWorkloadConfig(), seed=0)
workload.train_theta, workload.train_x, workload.dim_theta, workload.dim_x = theta, x, 2, 2
model = workload.build_model()
with tracker.model_folder() as where:
    tracker.log_model(model, None, workload.mlflow_model(model, where), workload.model_name)
print(json.dumps({"mlflow": "mlflow" in sys.modules, "where": str(where)}))
"""


def test_an_sbi_posterior_is_handed_over_and_logged_by_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg, handle = _run(tmp_path)
    run_dir = tmp_path / "runs" / "r"
    sending = relay.start(handle, run_dir, None, ("trainforge.workloads.sbi.pyfunc", "sbi"))
    arguments = json.dumps([handle.for_workers(), config.to_container(cfg), str(tmp_path)])
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rank_0 = subprocess.run([sys.executable, "-c", SBI_RANK_0, arguments], capture_output=True,
                            text=True, timeout=120, env=env, cwd=REPO)  # fmt: skip
    assert rank_0.returncode == 0, rank_0.stderr
    said = json.loads(rank_0.stdout)
    assert said["mlflow"] is False
    # the posterior's files wait beside the relay's until the command has logged them
    assert Path(said["where"]).parent == relay.files_folder(run_dir / relay.RELAY_FILE)
    sending.log_kept_model()
    sending.stop()

    monkeypatch.setenv("MLFLOW_TRACKING_URI", handle.tracking_uri)
    run = MlflowClient(handle.tracking_uri).get_run(handle.run_id)
    [logged] = mlflow.search_logged_models(
        experiment_ids=[run.info.experiment_id],
        filter_string=f"source_run_id = '{handle.run_id}'",
        output_format="list",
    )
    assert logged.name == "posterior"
    with _python_path_kept():
        loaded = mlflow.pyfunc.load_model(logged.model_uri)
    x = np.zeros((1, 2), dtype=np.float32)
    assert loaded.predict(x, params={"num_samples": 5}).shape == (5, 3)
    # its files went with the relay's
    assert sorted(p.name for p in run_dir.iterdir()) == [RUNS_FILE]


@pytest.mark.parametrize("start", ["unreachable", "failed"])
def test_a_run_never_made_leaves_rank_0s_records_in_the_spool(tmp_path: Path, start: str) -> None:
    """MLflow unreachable when the command started the run (the run's start spools, and says
    so), or the start failed: what rank 0 wrote goes to the spool for ``trainforge
    tracking-sync``, which sends it into the run of that name."""
    _, for_workers, start_run = _for_workers(tmp_path)
    Spool(str(for_workers.relay_path), for_workers.identity()).write(
        "metrics", metrics=[["epoch", 1.0, 1000, 1]]
    )
    offline = RunHandle(**{**for_workers.for_workers(), "relay_path": None})

    def make() -> RunHandle:
        if start == "failed":
            raise RuntimeError("no store")
        return offline

    making = relay.RunInTheMaking(make, for_workers, None, ())
    making.start()
    handle, sending = making.made()
    assert sending is None and handle == (offline if start == "unreachable" else None)
    making.stop()

    run_dir = tmp_path / "runs" / "r"
    assert not (run_dir / relay.RELAY_FILE).exists()
    start_run()  # the server is back
    assert replay(run_dir / SPOOL_FILE, tracking_uri=for_workers.tracking_uri) == {"metrics": 1}


def test_on_ray_trains_workers_node_0_is_sampled_once_rank_0_writes_and_its_model_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ray places Ray Train's rank 0, maybe on another node, where it samples its node
    itself: the command samples node 0 only once rank 0 has written to the relay file (past
    what an earlier command left), and logs the model rank 0 kept in the run folder."""
    _, for_workers, start_run = _for_workers(tmp_path)
    relay_file = Path(str(for_workers.relay_path))
    earlier = Spool(relay_file, for_workers.identity())
    earlier.write("metrics", metrics=[["epoch", 1.0, 1000, 1]])  # an earlier command left it
    handed_over: list[RunHandle] = []
    making = relay.RunInTheMaking(start_run, for_workers, 0.2, (), handed_over.append)
    making.start()
    handle, sending = making.made()
    assert handle is not None and sending is not None
    assert [h.run_id for h in handed_over] == [handle.run_id]
    assert handed_over[0].relay_path is None  # those it is handed to send their own records
    time.sleep(1.0)  # several of the monitor's intervals, and the relay's passes
    assert sending.monitor is None  # rank 0 has not written: it may be elsewhere

    earlier.write("tags", tags={"world_size": "2"})  # rank 0 relays: it runs on this node
    deadline = time.monotonic() + 30
    while sending.monitor is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert sending.monitor is not None
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    example = torch.zeros(2, 1, 8, 8)
    logged_model, example_array = model_logging.for_mlflow(model, example)
    handed = model_logging.handed_over(logged_model, example_array, None)
    relay.keep_handed_model(str(relay_file), handed)  # as rank 0 does at its end
    time.sleep(0.5)  # a sample of the system
    sending.log_kept_model()
    making.stop()

    client = MlflowClient(handle.tracking_uri)
    run = client.get_run(handle.run_id)
    assert [m.value for m in client.get_metric_history(handle.run_id, "epoch")] == [1.0]
    assert run.data.tags["world_size"] == "2"
    assert any(key.startswith("system/node_0/") for key in run.data.metrics), run.data.metrics
    loaded = the_logged_model(handle.tracking_uri, run, monkeypatch)
    torch.testing.assert_close(loaded(example), model(example))
    assert sorted(p.name for p in relay_file.parent.iterdir()) == [RUNS_FILE]


def the_logged_model(tracking_uri: str, run: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The run's one logged model, loaded through MLflow's fluent API."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", tracking_uri)
    [logged] = mlflow.search_logged_models(
        experiment_ids=[run.info.experiment_id],
        filter_string=f"source_run_id = '{run.info.run_id}'",
        output_format="list",
    )
    with _python_path_kept():
        return mlflow.pytorch.load_model(logged.model_uri)


@contextlib.contextmanager
def _python_path_kept() -> Iterator[None]:
    """MLflow puts a loaded model's shipped code (a cut-down trainforge) first on sys.path: a
    later test's spawned processes, which take this one's path, would import that trainforge."""
    kept = list(sys.path)
    try:
        yield
    finally:
        sys.path[:] = kept
