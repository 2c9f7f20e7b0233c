"""The type checker passes over the package (mypy, basic mode; settings in pyproject.toml).

The package's folder is runtime/ but it imports as trainforge: mypy is pointed at a folder
holding a ``trainforge`` link to runtime/, so module names match what users import."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_mypy_passes_over_the_package(tmp_path: Path) -> None:
    (tmp_path / "trainforge").symlink_to(ROOT / "runtime", target_is_directory=True)
    command = [
        sys.executable, "-m", "mypy", "-p", "trainforge",
        "--config-file", str(ROOT / "pyproject.toml"),
        "--cache-dir", str(ROOT / ".mypy_cache"),
    ]  # fmt: skip
    env = {**os.environ, "MYPYPATH": str(tmp_path)}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout
