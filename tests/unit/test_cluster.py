"""The driver's cluster helpers (``trainforge.driver.cluster``): the storage root a run
writes under."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainforge import config
from trainforge.driver import cluster

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "recipes" / "cnn" / "digits_simple_cnn.yaml"


def test_storage_root_is_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    run = config.load(DIGITS, ["run.storage_path=./runs"]).run
    assert cluster.storage_root(run) == str((tmp_path / "runs").resolve())
    run = config.load(DIGITS, ["run.storage_path=s3://bucket/runs"]).run
    assert cluster.storage_root(run) == "s3://bucket/runs"
