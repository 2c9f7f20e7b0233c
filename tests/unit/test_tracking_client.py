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


@pytest.mark.parametrize(
    ("uri", "shown"),
    [
        ("https://user:pass@host", "https://***@host"),
        ("https://user:p%40ss@mlflow.example.com:5000/base", "https://***@mlflow.example.com:5000/base"),
        ("postgresql+psycopg2://mlflow:pw@db:5432/mlflow", "postgresql+psycopg2://***@db:5432/mlflow"),
        ("http://127.0.0.1:5000", "http://127.0.0.1:5000"),
        ("sqlite:////abs/mlflow.db", "sqlite:////abs/mlflow.db"),
        ("https://host/path@v1", "https://host/path@v1"),  # an @ after the host is no login
    ],
)  # fmt: skip
def test_redact_hides_credentials(uri: str, shown: str) -> None:
    assert tracking_client.redact(uri) == shown


def test_the_run_handle_spools_no_credentials() -> None:
    handle = tracking_client.RunHandle(
        "https://user:pass@host", "trainforge", "run", None, False, "/tmp/spool.jsonl"
    )
    assert handle.identity()["tracking_uri"] == "https://***@host"
    assert handle.for_workers()["tracking_uri"] == "https://user:pass@host"  # they log with it


@pytest.mark.parametrize(
    ("uri", "problem"),
    [
        ("htp://nowhere", "has scheme 'htp', which MLflow does not serve (did you mean 'http'?)"),
        ("http://", "names no host"),
        ("./mlruns", "is a folder, and MLflow's file store is gone"),
        ("file:///tmp/mlruns", "is a folder, and MLflow's file store is gone"),
        ("sqlite://mlflow.db", "needs three slashes"),
    ],
)
def test_uri_problem_names_what_is_wrong(uri: str, problem: str) -> None:
    found = tracking_client.uri_problem(uri)
    assert found is not None and found.startswith(problem)


@pytest.mark.parametrize(
    "uri",
    ["http://127.0.0.1:5000", "https://u:p@mlflow.example.com", "sqlite:///mlflow.db",
     "sqlite:////abs/mlflow.db", "postgresql://u:p@db/mlflow", "mysql+pymysql://db/x",
     "databricks"],
)  # fmt: skip
def test_uri_problem_accepts_what_mlflow_serves(uri: str) -> None:
    if uri == "databricks":
        uri = "databricks://profile"
    assert tracking_client.uri_problem(uri) is None


def test_redact_all_hides_the_credentials_of_every_url_in_a_text() -> None:
    line = "trainforge train r.yaml tracking.tracking_uri=https://al:p%40ss@h:5/x s3://key@bucket/p"
    assert tracking_client.redact_all(line) == (
        "trainforge train r.yaml tracking.tracking_uri=https://***@h:5/x s3://***@bucket/p"
    )
    assert tracking_client.redact_all("no url here: a@b") == "no url here: a@b"


def test_open_store_makes_a_local_databases_schema_and_asks_a_server_nothing(
    tmp_path: Path,
) -> None:
    """What a prestarted warm worker does ahead of its run (warm_pool.prestart)."""
    import sqlite3

    database = tmp_path / "mlflow.db"
    tracking_client.open_store(f"sqlite:///{database}", ask_server=False)
    with sqlite3.connect(database) as connection:
        tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master")}
    assert {"experiments", "runs", "alembic_version"} <= tables
    # the discard port: a request would fail
    tracking_client.open_store("http://127.0.0.1:9", ask_server=False)
