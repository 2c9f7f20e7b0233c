"""trainforge: a distributed training runtime. The source folder is ``runtime/``; the package
installs and imports as ``trainforge``.

The Python API (``api.py``): ``train`` (a recipe, as `trainforge train` runs it) returning a
``Result``, ``load`` (a finished run's model), and the errors they raise, ``RecipeError`` and
``RunFailed``. What a user's own workload imports: ``Workload`` (the class that
``workload.entry`` names a subclass of), ``TensorData`` (a split held as tensors) and
``Batch``. They load on first use, so that ``import trainforge`` (the command line's first
step) brings no torch."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {
    "train": "trainforge.api",
    "load": "trainforge.api",
    "Result": "trainforge.api",
    "RunFailed": "trainforge.api",
    "RecipeError": "trainforge.errors",
    "Workload": "trainforge.workloads.base",
    "TensorData": "trainforge.data.types",
    "Batch": "trainforge.data.types",
}
__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'trainforge' has no attribute {name!r}")
