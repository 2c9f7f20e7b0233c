"""trainforge: a distributed training runtime. The source folder is ``runtime/``; the package
installs and imports as ``trainforge``.

What a user's own code imports from here: ``Workload`` (the class a workload named by
``workload.entry`` subclasses), ``TensorData`` (a split held as tensors) and ``Batch``. They
load on first use, so that ``import trainforge`` (the command line's first step) brings no
torch."""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_PUBLIC = {
    "Workload": "trainforge.workloads.base",
    "TensorData": "trainforge.data.types",
    "Batch": "trainforge.data.types",
}
__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'trainforge' has no attribute {name!r}")
