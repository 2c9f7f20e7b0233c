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
