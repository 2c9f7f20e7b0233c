"""bench/startup.py's --baseline: the folder its commands import `trainforge` from, checked
before any command runs (a relative path, taken from the commands' temporary folder, once
named nothing and the "baseline" ran this checkout); and the modes it runs."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "startup.py"


def _startup():
    spec = importlib.util.spec_from_file_location("bench_startup", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_baseline_is_the_package_its_commands_import(tmp_path: Path, monkeypatch) -> None:
    startup = _startup()
    baseline = tmp_path / "base"
    (baseline / "trainforge").mkdir(parents=True)
    (baseline / "trainforge" / "__init__.py").write_text("")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(tmp_path)
    env = dict(os.environ)
    assert startup.baseline_path("base", env, work) == str(baseline)  # relative to here
    monkeypatch.chdir(work)  # here "base" names nothing: the checkout's package would run
    with pytest.raises(SystemExit, match=r"--baseline base: its commands would import"):
        startup.baseline_path("base", env, work)


def test_the_modes_run_are_those_listed_and_no_others() -> None:
    """An explicit --modes runs exactly those (a device step once ran a private-Ray baseline
    nobody listed, 61 s of GPU time); the default adds the baseline only where one is given."""
    startup = _startup()
    assert startup.run_modes("cold", "/base") == ["cold"]
    assert startup.run_modes("baseline_cold,cold", "/base") == ["baseline_cold", "cold"]
    assert startup.run_modes(None, None) == ["cold", "warm", "private"]
    assert startup.run_modes(None, "/base") == ["cold", "warm", "private", "baseline"]
