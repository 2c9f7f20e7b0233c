"""The training data as an MLflow dataset input: the run page's "Datasets used" (name, digest,
size), and the runs that used the same data found by its digest.

The digest identifies the data by what determines them, never by reading them: hashing the
rows of a 10^7-row split would cost seconds at every start. A workload says what its data
are made from (``Workload.training_data``): a CNN data set's name, split seed and sizes; an
SBI run's task, number of simulations and the key of the simulation cache that holds them.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import Any

CONTEXT = "training"  # the input tag mlflow.data.context, shown beside the dataset in the UI
DIGEST_CHARS = 8  # as long as the digests mlflow.data computes


def digest_of(identity: dict[str, Any]) -> str:
    """A short, stable hash of what determines the data (JSON-serialisable values)."""
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


@dataclass(frozen=True)
class TrainingData:
    """The training split as MLflow should record it."""

    name: str
    digest: str
    rows: int
    """The size: rows (samples) of the training split."""
    source: str
    """Where the data come from: a path or URI, or the code that makes them."""
    source_type: str = "code"
    """MLflow's dataset source type: ``local`` for files, ``code`` for data made by code."""
    profile: dict[str, Any] = field(default_factory=dict)
    """More facts beside ``num_rows`` (validation rows, shapes…), shown in the dataset's panel."""

    @classmethod
    def of(
        cls, name: str, identity: dict[str, Any], rows: int, source: str, **kwargs: Any
    ) -> TrainingData:
        return cls(name, digest_of(identity), rows, source, **kwargs)

    def as_input(self) -> Any:
        """MLflow's ``DatasetInput`` entity, logged with ``MlflowClient.log_inputs``."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        dataset = Dataset(
            name=self.name,
            digest=self.digest,
            source_type=self.source_type,
            source=json.dumps({"uri": self.source}),
            profile=json.dumps({"num_rows": self.rows, **self.profile}),
        )
        return DatasetInput(dataset, tags=[InputTag("mlflow.data.context", CONTEXT)])

    def log(self, client: Any, run_id: str) -> None:
        """Logged as run ``run_id``'s input. Runs that log the same data into one experiment
        at the same moment (two commands on the same recipe) race in MLflow's store: each
        finds the dataset missing, and the second insert fails on the store's unique
        constraint (4 of 5 times with 4 runs at once, SQLite). The dataset exists after that,
        so a second call links it."""
        try:
            client.log_inputs(run_id, [self.as_input()])
        except Exception as exc:
            text = str(exc).lower()
            if "unique" not in text and "duplicate" not in text:
                raise
            client.log_inputs(run_id, [self.as_input()])

    def to_record(self) -> dict[str, Any]:
        """For the spool (a JSON line)."""
        return asdict(self)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> TrainingData:
        return cls(**record)
