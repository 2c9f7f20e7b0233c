"""A new SQLite MLflow store starts as a copy of an empty one, made once per MLflow version.

MLflow builds a new SQLite store by creating its tables and then running every one of its
schema migrations (alembic), ~2.6 s of one core on this project's 2-core CPU: the first
command in every new folder paid it, on a cold command's critical path. The result is the same
for every store of one MLflow version, so it is made once, in ``$TRAINFORGE_HOME/mlflow-schema/``
(default ``~/.cache/trainforge/``), without its rows: MLflow finds the schema current and
creates its Default experiment itself, with the artifact location MLflow gives it (``./mlruns``
of the folder the store is first opened from; trainforge's own experiments keep theirs beside
the store, ``client._create_experiment``).
Anything that goes wrong here leaves the store to MLflow to make: a run never depends on it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import tempfile
from pathlib import Path

from trainforge import settings

ROWS_MADE_WITH_THE_SCHEMA = ("experiments",)
"""What MLflow writes into a new store besides its schema: the Default experiment, whose
artifact location is MLflow's default for the new store (it would be the template's temporary
folder). MLflow makes it again where a store has no experiment at all. The workspace row and the
schema version stay."""


def seed(uri: str) -> None:
    """Where ``uri`` names a SQLite file that does not exist yet, put a copy of the empty
    store there; otherwise nothing."""
    path = sqlite_file(uri)
    if path is None or path.exists() or not path.parent.is_dir():
        return
    with contextlib.suppress(Exception):  # MLflow makes the store itself
        template = template_path()
        if not template.exists():
            make_template(template)
        copy = path.with_name(f".{path.name}.{os.getpid()}.new")
        try:
            shutil.copyfile(template, copy)
            os.link(copy, path)  # only where still absent: a concurrent command may have made it
        except FileExistsError:
            pass
        finally:
            copy.unlink(missing_ok=True)


def sqlite_file(uri: str) -> Path | None:
    """The file of a ``sqlite:///…`` URI (query dropped), None for any other store."""
    prefix = "sqlite:///"
    if not uri.startswith(prefix):
        return None
    name = uri[len(prefix) :].split("?", 1)[0]
    if not name or name == ":memory:":
        return None
    return Path(name)


def template_path() -> Path:
    import mlflow

    return settings.home() / "mlflow-schema" / f"mlflow-{mlflow.__version__}.db"


def make_template(template: Path) -> None:
    """Let MLflow make a store in a temporary folder, empty it of its rows, and move it into
    place (atomically: a concurrent command finds either none or a whole one)."""
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    template.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=template.parent) as folder:
        made = Path(folder) / "store.db"
        store = SqlAlchemyStore(f"sqlite:///{made}", folder)
        store.engine.dispose()
        with contextlib.closing(sqlite3.connect(made)) as db:
            for table in ROWS_MADE_WITH_THE_SCHEMA:
                db.execute(f"DELETE FROM {table}")  # names of our own, above
            db.commit()
        os.replace(made, template)
