"""MLflow client helpers (``trainforge.tracking.client``): flattened params, the tracking URI."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainforge import config
from trainforge.tracking import client as tracking_client

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "recipes" / "cnn" / "digits_simple_cnn.yaml"


def test_flatten() -> None:
    flat = tracking_client.flatten(
        {"train": {"lr": 0.1, "clip": None}, "run": {"name": "x"}, "long": "y" * 7000, "n": 3}
    )
    assert flat == {
        "train.lr": "0.1",
        "train.clip": "None",
        "run.name": "x",
        "long": "y" * 6000,
        "n": "3",
    }


def test_flatten_a_real_recipe() -> None:
    flat = tracking_client.flatten(config.to_container(config.load(DIGITS)))
    assert flat["train.lr"] == "0.002"
    assert flat["workload.model"] == "simple_cnn"
    assert flat["run.name"] == "digits-simple-cnn"
    assert all(isinstance(v, str) and len(v) <= 6000 for v in flat.values())


def test_resolve_uri_default_is_absolute_sqlite_in_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    uri = tracking_client.resolve_uri(None)
    assert uri == "sqlite:///" + str((tmp_path / "mlflow.db").resolve())
    assert Path(uri[len("sqlite:///") :]).is_absolute()


def test_resolve_uri_relative_sqlite_becomes_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert tracking_client.resolve_uri("sqlite:///sub/t.db") == "sqlite:///" + str(
        (tmp_path / "sub" / "t.db").resolve()
    )
    absolute = "sqlite:////" + str(tmp_path).lstrip("/") + "/x.db"
    assert tracking_client.resolve_uri(absolute) == absolute
    assert tracking_client.resolve_uri("http://mlflow:5000") == "http://mlflow:5000"


def test_resolve_uri_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking:5000")
    assert tracking_client.resolve_uri(None) == "http://tracking:5000"
    assert tracking_client.resolve_uri("file:///tmp/mlruns") == "file:///tmp/mlruns"  # recipe wins
