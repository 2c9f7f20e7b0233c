"""The warning that each new worker will compile torch's source (``driver/bytecode.py``): said
when a package has no bytecode and Python may not write it, silent otherwise, and its advice
(``python -m compileall``) makes it go away."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainforge.driver import bytecode

DONT_WRITE = "PYTHONDONTWRITEBYTECODE is set"


@pytest.fixture
def package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A package with source and no bytecode, importable from a site folder of its own."""
    site = tmp_path / "site"
    name = f"tf_bytecode_probe_{os.getpid()}"
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(site))
    return name, site


def test_a_package_without_bytecode_that_python_may_not_write_is_named(
    package: tuple[str, Path],
) -> None:
    name, _ = package
    assert bytecode.compiled_at_each_start(name, writes=False) == DONT_WRITE
    assert bytecode.compiled_at_each_start(name, writes=True) is None  # the first run writes it


def test_a_folder_python_cannot_write_is_named(
    package: tuple[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    name, site = package
    monkeypatch.setattr(bytecode.os, "access", lambda path, mode: False)  # root writes anywhere
    assert bytecode.compiled_at_each_start(name, writes=True) == f"{site / name} is not writable"


def test_a_package_that_is_not_there_is_silent() -> None:
    assert bytecode.compiled_at_each_start("no_such_package_here", writes=False) is None


def test_the_warning_is_said_once_and_its_advice_silences_it(
    package: tuple[str, Path],
    capsys: pytest.CaptureFixture[str],
) -> None:
    name, site = package
    bytecode.warn_if_workers_compile_torch(name, writes=False)
    bytecode.warn_if_workers_compile_torch(name, writes=False)
    err = capsys.readouterr().err
    assert err.count("warning:") == 1, err
    assert f"({DONT_WRITE})" in err
    advice = err.split("Compile it once: ", 1)[1].strip()
    assert advice == f"python -m compileall -q {site}"
    subprocess.run([sys.executable, *advice.split()[1:]], check=True, timeout=60)
    assert bytecode.compiled_at_each_start(name, writes=False) is None


def test_a_command_whose_pycache_is_empty_is_warned_without_importing_torch(
    tmp_path: Path,
) -> None:
    """For real: with PYTHONPYCACHEPREFIX on an empty folder, torch's bytecode is looked for
    there, and PYTHONDONTWRITEBYTECODE forbids writing it."""
    script = (
        "import sys\nfrom trainforge.driver import bytecode\n"
        "bytecode.warn_if_workers_compile_torch()\nprint('torch' in sys.modules)\n"
    )
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(tmp_path / "empty")}
    for dont_write, warned in (("1", True), ("", False)):
        env["PYTHONDONTWRITEBYTECODE"] = dont_write
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              env=env, timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "False"  # found without importing it
        assert ("torch has no Python bytecode here" in done.stderr) is warned, done.stderr
