"""Driver-side launch checks (``trainforge.driver.launch``) that run before any worker starts:
an existing run folder is refused unless the recipe resumes; and a run stopped before its
workers' run began still ends its MLflow run (``driver/run.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainforge import config
from trainforge.driver import launch, run
from trainforge.driver.workers.base import Finished, WorkerGroup
from trainforge.errors import RecipeError
from trainforge.worker.payload import WorkerPayload

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "recipes" / "cnn" / "digits_simple_cnn.yaml"


def test_existing_run_without_resume_is_refused(tmp_path: Path) -> None:
    cfg = config.load(DIGITS, ["checkpoint.resume=false"])
    launch.check_existing_run(cfg, str(tmp_path))  # no run folder yet: fine
    (tmp_path / cfg.run.name).mkdir()
    with pytest.raises(RecipeError, match=r"run\.name"):
        launch.check_existing_run(cfg, str(tmp_path))


def test_existing_run_with_resume_is_fine(tmp_path: Path) -> None:
    cfg = config.load(DIGITS, ["checkpoint.resume=true"])
    (tmp_path / cfg.run.name).mkdir()
    assert launch.check_existing_run(cfg, str(tmp_path)) is None  # no checkpoint yet


def test_a_run_whose_checkpoints_all_fail_verification_is_refused(tmp_path: Path) -> None:
    from trainforge import checkpoint
    from trainforge.errors import NoValidCheckpoint

    cfg = config.load(DIGITS, ["checkpoint.resume=true"])
    folder = tmp_path / cfg.run.name / "checkpoint_000000"
    folder.mkdir(parents=True)
    checkpoint.save(folder, {"global_step": 3}, "")
    assert launch.check_existing_run(cfg, str(tmp_path)) == folder  # where the resume starts
    (folder / checkpoint.MANIFEST_FILE).unlink()
    with pytest.raises(NoValidCheckpoint, match=r"checkpoint_000000: no manifest\.json"):
        launch.check_existing_run(cfg, str(tmp_path))
    assert (folder / checkpoint.STATE_FILE).exists()


class StoppedAtOnce(WorkerGroup):
    """A group whose workers' run is stopped (Ctrl-C) as it is asked for."""

    kind = "stopped"

    def run(self, payload: WorkerPayload) -> Finished:
        assert payload.mlflow is not None and payload.mlflow["relay_path"]  # rank 0 relays
        raise KeyboardInterrupt


def test_a_ctrl_c_before_the_workers_run_begins_still_ends_the_mlflow_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command makes the MLflow run on a thread; a Ctrl-C as the workers' run is asked
    for ends that run KILLED, not left RUNNING, after the command's one line."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = config.load(DIGITS, [f"run.storage_path={tmp_path}", f"tracking.tracking_uri={uri}",
                               "tracking.system_metrics=false", "run.name=stopped"])  # fmt: skip
    payload = run.worker_payload(cfg, str(tmp_path))
    outcome = run.run_workers(cfg, payload, StoppedAtOnce(cfg))
    assert outcome.exit_code == 130
    assert capsys.readouterr().out.splitlines()[-1] == f"[trainforge] {run.INTERRUPTED}"
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(cfg.tracking.experiment)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert [(r.info.run_name, r.info.status) for r in runs] == [("stopped", "KILLED")]
    assert runs[0].info.run_id == outcome.mlflow_run_id
