"""Recipe section ``workload`` for a user's own workload (``workload.kind: python``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from omegaconf import MISSING

from trainforge.config.schema import WorkloadSection


@dataclass
class PythonWorkloadConfig(WorkloadSection):
    FREE_FORM: ClassVar[tuple[str, ...]] = ("config",)

    kind: str = "python"
    """Workload family tag; selects this schema."""
    entry: str = MISSING
    """The user's workload by import path, ``my_pkg.module:MyWorkload``: a subclass of
    ``trainforge.Workload``, or a function returning an instance of one. Called with the
    workload's ``config`` (and ``seed=`` where it takes one)."""
    config: dict[str, Any] = field(default_factory=dict)
    """The workload's own settings, as nested as it likes. Checked against the entry's
    ``Config`` dataclass where it has one (its instance is what the entry gets), else handed
    over as a dict. Logged to MLflow as the recipe's other settings are."""
    code_dir: str | None = None
    """Where the driver found the entry's module (filled in by the driver): the folder Ray's
    workers elsewhere on the machine, or on a shared file system, import it from."""
