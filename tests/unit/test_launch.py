"""Driver-side launch checks (``trainforge.driver.launch``) that run before any Ray worker
starts: an existing run folder is refused unless the recipe resumes."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainforge import config
from trainforge.driver import launch
from trainforge.errors import RecipeError

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


def test_a_ctrl_c_before_the_workers_run_begins_still_ends_the_mlflow_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command makes the MLflow run on a thread; a Ctrl-C between that thread's start and
    the workers' run (here: as the workers' handle is taken, the step after it) ends the run
    KILLED, not left RUNNING."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = config.load(DIGITS, [f"run.storage_path={tmp_path}", f"tracking.tracking_uri={uri}",
                               "tracking.system_metrics=false", "run.name=stopped"])  # fmt: skip
    root = str(tmp_path)
    making_run = launch.run_in_the_making

    def interrupted_after_the_thread_starts(*args: object) -> object:
        making = making_run(*args)

        def ctrl_c() -> None:
            raise KeyboardInterrupt

        making.for_workers.for_workers = ctrl_c  # what run_workers calls next
        return making

    monkeypatch.setattr(launch, "run_in_the_making", interrupted_after_the_thread_starts)
    payload = launch.worker_payload(cfg, root)
    never_started = object()  # the workers' run is never reached
    outcome = launch.run_workers(cfg, payload, root, None, {}, (), None, own=never_started)  # type: ignore[arg-type]
    assert outcome.exit_code == 130
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name(cfg.tracking.experiment)
    assert experiment is not None
    runs = client.search_runs([experiment.experiment_id])
    assert [(r.info.run_name, r.info.status) for r in runs] == [("stopped", "KILLED")]
