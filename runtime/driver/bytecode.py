"""Whether each new worker process will compile torch's Python source again.

Python reads a module's bytecode from its ``__pycache__`` and writes it there after compiling
the source, unless told not to (``PYTHONDONTWRITEBYTECODE``, set in many container images) or
unable to (a read-only site-packages). pip writes bytecode when it installs; uv does not unless
asked. Without it every process that imports torch compiles its ~770 modules first: on an H200
host ``import torch`` took 3.5 s without bytecode, 1.9 s with it. A worker pays that at each start,
and nothing in a run's output would say why its workers are slow to start; this says it once.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from importlib.machinery import ModuleSpec
from pathlib import Path

from trainforge import log


def compiled_at_each_start(module: str = "torch", writes: bool | None = None) -> str | None:
    """The reason ``module`` (a package) is compiled from source by every new process, or None
    when it has bytecode or the first process can write it. Found without importing it."""
    return _reason(importlib.util.find_spec(module), writes)


def _reason(spec: ModuleSpec | None, writes: bool | None) -> str | None:
    if spec is None or spec.origin is None or not spec.origin.endswith(".py"):
        return None  # not installed, or not plain source (a frozen or zipped install)
    if Path(importlib.util.cache_from_source(spec.origin)).is_file():
        return None
    if writes is None:
        writes = not sys.flags.dont_write_bytecode
    package = Path(spec.origin).parent
    if not writes:
        return "PYTHONDONTWRITEBYTECODE is set"
    if not os.access(package, os.W_OK):
        return f"{package} is not writable"
    return None  # the first process writes it; the next ones read it


def warn_if_workers_compile_torch(module: str = "torch", writes: bool | None = None) -> None:
    """One warning when this command's new worker processes will each compile torch's source
    (``module``, ``writes``: as for ``compiled_at_each_start``, for tests)."""
    spec = importlib.util.find_spec(module)
    reason = _reason(spec, writes)
    if reason is None:
        return
    assert spec is not None and spec.origin is not None  # what a reason implies
    site = Path(spec.origin).parent.parent
    log.warn(
        f"{module} has no Python bytecode here and none can be written ({reason}): each worker "
        f"compiles its source as it starts (seconds each). Compile it once: "
        f"python -m compileall -q {site}",
        key="bytecode",
    )
