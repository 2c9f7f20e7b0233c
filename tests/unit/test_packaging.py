"""What the wheel holds (pyproject.toml): every package, the shipped recipes and runtime env,
sbi as an extra; and that the install is `trainforge`, never a top-level `runtime` that a
user's own runtime.py or runtime/ would collide with.

tests/integration/test_packaging.py builds and installs the real wheel."""

from __future__ import annotations

import fnmatch
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import trainforge

tomllib = pytest.importorskip("tomllib")  # Python ≥ 3.11; the suite runs on 3.11

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "runtime"


def _pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def test_every_package_folder_is_in_the_wheel() -> None:
    """setuptools is given an explicit list (the source folder is not named trainforge): a new
    subpackage missing from it would import here and be absent from the wheel."""
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    folders = {
        ".".join(("trainforge", *init.parent.relative_to(SOURCE).parts))
        for init in SOURCE.rglob("__init__.py")
    }
    assert folders - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    package_dir = _pyproject()["tool"]["setuptools"]["package-dir"]
    for package in listed - folders:  # the data packages: recipes and deploy
        assert (REPO / package_dir[package]).is_dir(), package


def test_every_recipe_and_the_runtime_env_are_package_data() -> None:
    data = _pyproject()["tool"]["setuptools"]["package-data"]
    recipes = [p.relative_to(REPO / "recipes").as_posix() for p in REPO.glob("recipes/**/*")]
    recipes = [p for p in recipes if p.endswith(".yaml")]
    assert recipes
    for recipe in recipes:
        assert any(fnmatch.fnmatch(recipe, glob) for glob in data["trainforge.recipes"]), recipe
    assert data["trainforge.deploy"] == ["runtime_env.yaml"]


def test_sbi_is_an_extra_that_the_test_extra_pulls() -> None:
    project = _pyproject()["project"]
    assert not any(dep.startswith("sbi") for dep in project["dependencies"])
    extras = project["optional-dependencies"]
    assert any(dep.startswith("sbi") for dep in extras["sbi"])
    assert "trainforge[sbi]" in extras["test"]  # the README's test install stays complete


def test_no_top_level_runtime_is_installed(tmp_path: Path) -> None:
    code = "import importlib.util as u; print(u.find_spec('runtime'), u.find_spec('trainforge'))"
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True,
        timeout=60, check=True,
    )  # fmt: skip
    runtime_spec, trainforge_spec = done.stdout.split(" ", 1)
    assert runtime_spec == "None"
    assert trainforge_spec != "None"


def test_a_users_runtime_module_and_package_change_nothing(tmp_path: Path) -> None:
    """Users' projects often hold a runtime.py or runtime/ (the working directory is first on
    sys.path under ``python -m``); neither may be imported in trainforge's place."""
    (tmp_path / "runtime.py").write_text("raise RuntimeError('the user runtime.py was imported')\n")
    (tmp_path / "runtime").mkdir()
    (tmp_path / "runtime" / "__init__.py").write_text(
        "raise RuntimeError('the user runtime/ package was imported')\n"
    )
    script = Path(sys.executable).with_name("trainforge")
    version = [str(script)] if script.is_file() else [sys.executable, "-m", "trainforge"]
    done = subprocess.run(
        [*version, "--version"], cwd=tmp_path, env=_env(), capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"trainforge {trainforge.__version__}"
    done = subprocess.run(
        [sys.executable, "-m", "trainforge", "validate", "digits_simple_cnn", "train.lr=0.02"],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "lr: 0.02" in done.stdout
    assert "imported" not in done.stderr
