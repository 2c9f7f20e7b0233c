"""A new SQLite MLflow store made from the empty copy (``trainforge.tracking.new_store``): the
same schema as MLflow makes, its own Default experiment, and nothing touched that exists."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from trainforge import settings
from trainforge.tracking import new_store


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(settings.HOME.name, str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)  # MLflow's default artifact root, ./mlruns, is the folder's
    return tmp_path / "home"


def schema(path: Path) -> dict[str, list[str]]:
    """Every table's and index's definition, line by line: the order of a table's constraints
    differs between two stores that MLflow made (a set's order in its migrations)."""
    with sqlite3.connect(path) as db:
        found = db.execute("SELECT name, sql FROM sqlite_master WHERE sql IS NOT NULL")
        return {
            name: sorted(line.strip().rstrip(",").strip() for line in sql.splitlines())
            for name, sql in found
        }


def rows(path: Path, table: str) -> list[tuple[object, ...]]:
    with sqlite3.connect(path) as db:
        return list(db.execute(f"SELECT * FROM {table}"))


def test_a_new_store_is_the_store_mlflow_makes_and_mlflow_adds_its_default_experiment(
    home: Path, tmp_path: Path
) -> None:
    made_by_mlflow = tmp_path / "mlflow_made.db"
    MlflowClient(tracking_uri=f"sqlite:///{made_by_mlflow}").search_experiments()

    first = tmp_path / "first" / "mlflow.db"
    first.parent.mkdir()
    new_store.seed(f"sqlite:///{first}")
    template = new_store.template_path()
    assert template.parent == home / "mlflow-schema" and template.is_file()
    assert rows(template, "experiments") == []  # no artifact location of the template's own
    assert schema(first) == schema(template) == schema(made_by_mlflow)
    assert rows(first, "alembic_version") == rows(made_by_mlflow, "alembic_version")

    client = MlflowClient(tracking_uri=f"sqlite:///{first}")
    default = client.get_experiment("0")
    assert (default.name, default.artifact_location) == ("Default", str(tmp_path / "mlruns" / "0"))
    run = client.create_run(client.create_experiment("e"))
    client.log_metric(run.info.run_id, "loss", 0.5)
    assert client.get_run(run.info.run_id).data.metrics == {"loss": 0.5}

    made_at = template.stat().st_mtime_ns  # a later store copies the same template
    second = tmp_path / "second.db"
    new_store.seed(f"sqlite:///{second}?timeout=5")
    assert template.stat().st_mtime_ns == made_at
    assert schema(second) == schema(made_by_mlflow) and rows(second, "experiments") == []
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".new")) == []


def test_what_exists_or_is_no_sqlite_file_is_left_alone(home: Path, tmp_path: Path) -> None:
    existing = tmp_path / "existing.db"
    existing.write_bytes(b"a user's file")
    new_store.seed(f"sqlite:///{existing}")
    assert existing.read_bytes() == b"a user's file"

    new_store.seed(f"sqlite:///{tmp_path / 'no_such_folder' / 'mlflow.db'}")
    assert not (tmp_path / "no_such_folder").exists()  # MLflow says what is wrong, as before

    for uri in ("http://127.0.0.1:5000", "sqlite:///:memory:", "postgresql://h/db"):
        new_store.seed(uri)
    assert not home.exists()  # no template made for stores that are no SQLite file


def test_sqlite_file_names_the_file_of_a_sqlite_uri() -> None:
    assert new_store.sqlite_file("sqlite:////abs/m.db?timeout=5") == Path("/abs/m.db")
    assert new_store.sqlite_file("sqlite:///:memory:") is None
    assert new_store.sqlite_file("https://h") is None
