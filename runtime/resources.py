"""Files that ship with trainforge: the recipes and the job runtime env.

An installed wheel holds them inside the package (``trainforge/recipes``,
``trainforge/deploy/runtime_env.yaml``, see pyproject.toml); an editable install of a checkout
imports the package from ``runtime/``, and they are the checkout's own top-level folders.
"""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent


def shipped(name: str) -> Path:
    """The shipped folder ``name`` (``recipes`` or ``deploy``), installed or checked out."""
    installed = PACKAGE_DIR / name
    return installed if installed.is_dir() else PACKAGE_DIR.parent / name


def recipes_dir() -> Path:
    return shipped("recipes")


def default_runtime_env() -> Path:
    return shipped("deploy") / "runtime_env.yaml"
