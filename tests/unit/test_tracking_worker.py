"""trainforge.tracking.worker, the parts a run's start and end wait for: MLflow imported and its
store opened on a background thread while the data are built, the system-metrics thread
told to stop without waiting out its round, and the final model logged without MLflow's scan
of every installed package (a real SQLite MLflow run)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from trainforge import config
from trainforge.distributed import WorkerContext
from trainforge.tracking import driver
from trainforge.tracking.worker import WorkerTracker

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "recipes" / "cnn" / "digits_simple_cnn.yaml"
CPU = torch.device("cpu")


def _tracked_run(tmp_path: Path, system_metrics: bool) -> tuple[config.Recipe, dict]:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    metrics = str(system_metrics).lower()
    overrides = [f"run.storage_path={tmp_path}", f"tracking.tracking_uri={uri}",
                 f"tracking.system_metrics={metrics}"]  # fmt: skip
    cfg = config.load(DIGITS, overrides)
    recipe = config.to_container(cfg)
    handle = driver.start_run(cfg.tracking, "t", recipe, config.to_yaml(cfg), str(tmp_path / "s"))
    return cfg, handle.for_workers()


def _ctx(rank: int) -> WorkerContext:
    return WorkerContext(rank=rank, local_rank=rank, world_size=1, node_rank=0, device=CPU)


def test_rank_0_opens_mlflow_in_the_background_and_start_waits_for_it(tmp_path: Path) -> None:
    cfg, handle = _tracked_run(tmp_path, system_metrics=True)
    tracker = WorkerTracker(handle, cfg.tracking, _ctx(0))
    tracker.prewarm()
    warming = tracker._warming
    assert warming is not None and warming.name == "mlflow-prewarm"
    tracker.start()
    assert not warming.is_alive()  # start() joined it before using MLflow
    assert "mlflow.system_metrics.system_metrics_monitor" in sys.modules
    monitor = tracker.system_monitor
    assert monitor is not None
    tracker.log({"train/loss": 1.5}, step=3)
    tracker.close()
    assert monitor._shutdown_event.is_set() and tracker.system_monitor is None
    client = MlflowClient(handle["tracking_uri"])
    history = client.get_metric_history(handle["run_id"], "train/loss")
    assert [(m.step, m.value) for m in history] == [(3, 1.5)]  # close() still commits


def test_ranks_that_never_talk_to_mlflow_do_not_warm_it(tmp_path: Path) -> None:
    cfg, handle = _tracked_run(tmp_path, system_metrics=False)
    other = WorkerContext(rank=1, local_rank=1, world_size=2, node_rank=0, device=CPU)
    tracker = WorkerTracker(handle, cfg.tracking, other)
    tracker.prewarm()
    assert tracker._warming is None
    offline = WorkerTracker(None, cfg.tracking, _ctx(0))
    offline.prewarm()
    assert offline._warming is None


def test_rank_0_logs_its_model_without_mlflows_scan_of_every_installed_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's end logs the model with its named requirements checked, but without MLflow
    mapping every installed distribution's files to modules first (``no_package_scan``); the
    map is left unbuilt afterwards, so a later inference of requirements builds it whole."""
    import importlib_metadata
    import mlflow
    from mlflow.utils import requirements_utils

    scans: list[int] = []
    real_scan = importlib_metadata.packages_distributions

    def counted_scan() -> dict:
        scans.append(1)
        return real_scan()

    monkeypatch.setattr(importlib_metadata, "packages_distributions", counted_scan)
    monkeypatch.setattr(requirements_utils, "_MODULES_TO_PACKAGES", None)  # as in a new process
    cfg, handle = _tracked_run(tmp_path, system_metrics=False)
    tracker = WorkerTracker(handle, cfg.tracking, _ctx(0))
    tracker.start()
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 10))
    tracker.log_model(model, torch.zeros(2, 1, 8, 8))
    tracker.close()
    assert scans == []
    assert requirements_utils._MODULES_TO_PACKAGES is None
    monkeypatch.setenv("MLFLOW_TRACKING_URI", handle["tracking_uri"])  # for the fluent API
    run = MlflowClient(handle["tracking_uri"]).get_run(handle["run_id"])
    [logged] = mlflow.search_logged_models(
        experiment_ids=[run.info.experiment_id],
        filter_string=f"source_run_id = '{run.info.run_id}'",
        output_format="list",
    )
    requirements = Path(
        mlflow.artifacts.download_artifacts(f"{logged.artifact_location}/requirements.txt")
    ).read_text()
    assert f"torch=={torch.__version__.split('+')[0]}" in requirements
    loaded = mlflow.pytorch.load_model(f"models:/{logged.model_id}")
    example = torch.randn(3, 1, 8, 8)
    torch.testing.assert_close(loaded(example), model(example))


STANDIN_MARKS_ITS_IMPORT = "from pathlib import Path\nimport os\nPath(os.environ['MARK']).touch()\n"


@pytest.mark.parametrize("how", ["pytorch_flavour", "plain import"])
def test_mlflows_pytorch_flavour_is_imported_without_lightning(tmp_path: Path, how: str) -> None:
    """MLflow's pytorch flavour imports Lightning at its own import where it is installed (~10 s
    on a GPU host, for a callback trainforge never uses); ``pytorch_flavour`` refuses it during
    that import, and a later ``import pytorch_lightning`` works. A stand-in package marks its
    import; a plain import of the flavour does import it (so the test can tell)."""
    import subprocess

    (tmp_path / "pytorch_lightning").mkdir()
    (tmp_path / "pytorch_lightning" / "__init__.py").write_text(STANDIN_MARKS_ITS_IMPORT)
    mark = tmp_path / "lightning-imported"
    imported = (
        "from trainforge.tracking import model_logging; flavour = model_logging.pytorch_flavour()"
        if how == "pytorch_flavour"
        else "import mlflow.pytorch as flavour"
    )
    script = (
        f"{imported}\n"
        "import os, sys\n"
        "assert callable(flavour.log_model)\n"
        "print('during', os.path.exists(os.environ['MARK']), 'pytorch_lightning' in sys.modules)\n"
        "import pytorch_lightning\n"
        "print('after', os.path.exists(os.environ['MARK']))\n"
    )
    path = os.pathsep.join([str(tmp_path), *sys.path])
    env = {**os.environ, "MARK": str(mark), "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    if how == "pytorch_flavour":
        assert done.stdout.splitlines() == ["during False False", "after True"]
    else:  # MLflow's own import reaches the stand-in (which lacks what MLflow wants from it)
        assert done.stdout.splitlines()[0].startswith("during True")


@pytest.mark.parametrize("how", ["model_logging.log", "MLflow's own"])
def test_a_model_is_logged_without_importing_ipython(tmp_path: Path, how: str) -> None:
    """MLflow asks whether it runs in a notebook by importing IPython while it logs a model
    (0.15 s here wherever IPython is installed); a process that has not imported it is none, so
    ``model_logging.log`` refuses that import during the logging, and a later ``import
    IPython`` works. A stand-in package marks its import; MLflow's own call does reach it (so
    the test can tell), and the model is logged either way."""
    import subprocess

    (tmp_path / "IPython").mkdir()
    (tmp_path / "IPython" / "__init__.py").write_text(STANDIN_MARKS_ITS_IMPORT)
    logged = (
        "model_logging.log(handle, *model_logging.for_mlflow(model, example))"
        if how == "model_logging.log"
        else "mlflow.set_tracking_uri(uri)\n"
        "with mlflow.start_run(run_id=run.info.run_id):\n"
        "    model_logging.pytorch_flavour().log_model(model, name='model',\n"
        "        input_example=example.numpy(), serialization_format='pickle')"
    )
    script = (
        "import os, sys\n"
        "import mlflow, torch\n"
        "from mlflow.tracking import MlflowClient\n"
        "from trainforge.tracking import model_logging\n"
        "from trainforge.tracking.client import RunHandle\n"
        f"uri = 'sqlite:///{tmp_path / 'mlflow.db'}'\n"
        "client = MlflowClient(uri)\n"
        "experiment = client.create_experiment('e')\n"
        "run = client.create_run(experiment)\n"
        f"handle = RunHandle(uri, 'e', 'r', run.info.run_id, False, '{tmp_path / 'spool'}')\n"
        "model, example = torch.nn.Linear(2, 1), torch.randn(1, 2)\n"
        f"{logged}\n"
        "print('during', os.path.exists(os.environ['MARK']), 'IPython' in sys.modules)\n"
        "import IPython\n"
        "print('after', os.path.exists(os.environ['MARK']))\n"
        "print('models', len(client.search_logged_models([experiment])))\n"
    )
    mark = tmp_path / "ipython-imported"
    path = os.pathsep.join([str(tmp_path), *sys.path])
    env = {**os.environ, "MARK": str(mark), "PYTHONPATH": path}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, cwd=tmp_path, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if line.split()[0] in
             ("during", "after", "models")]  # fmt: skip
    if how == "model_logging.log":
        assert lines == ["during False False", "after True", "models 1"]
    else:
        assert lines[0].startswith("during True") and lines[-1] == "models 1"


def test_logging_a_model_leaves_the_processs_tracking_uri_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``mlflow.set_tracking_uri`` sets $MLFLOW_TRACKING_URI too: left behind in a command, the
    lasting cluster it started afterwards carried that command's store to later commands."""
    import mlflow

    from trainforge.tracking import model_logging
    from trainforge.tracking.client import RunHandle

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    run_id = client.create_run(client.create_experiment("kept")).info.run_id
    handle = RunHandle(uri, "kept", "r", run_id, False, str(tmp_path / "spool.jsonl"))
    logged = []
    for before in (None, "sqlite:////elsewhere/mlflow.db"):
        if before is None:
            monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
        else:
            monkeypatch.setenv("MLFLOW_TRACKING_URI", before)
        model_logging.log(handle, custom=lambda **_: logged.append(mlflow.get_tracking_uri()))
        assert os.environ.get("MLFLOW_TRACKING_URI") == before
        # and MLflow's fluent API, which prefers its own global to the variable, follows it again
        assert mlflow.get_tracking_uri() != uri
        assert before is None or mlflow.get_tracking_uri() == before
    assert logged == [uri, uri]  # MLflow saw the run's store while it logged
