"""A user's own code named in a recipe by import path (``my_pkg.module:name``): an SBI prior or
simulator, a whole workload of the user's. Found where the command runs, and where Ray's
workers run on the same machine or a shared file system."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import os
import sys
from pathlib import Path
from typing import Any, TypeVar

from trainforge.errors import UserCodeError

S = TypeVar("S")


def is_import_path(name: str) -> bool:
    """A recipe value naming the user's code (``my_pkg.module:name``), not a built-in's name."""
    return ":" in name


def import_object(
    path: str, key: str, code_dir: str | None = None, error: type[UserCodeError] = UserCodeError
) -> Any:
    """``package.module:name`` → the object, or ``error`` naming the recipe key.

    Searched: the working directory first (like ``python -m``; console scripts leave it out),
    then ``code_dir`` — where the driver found the module, so that Ray workers started
    elsewhere on the same machine or a shared file system find it too — then sys.path.
    """
    module_name, sep, attribute = path.partition(":")
    if not sep or not module_name or not attribute:
        raise error(f"{key}: {path!r} is not an import path like 'my_pkg.module:name'")
    for folder in (code_dir, os.getcwd()):
        if folder and folder not in sys.path and os.path.isdir(folder):
            sys.path.insert(0, folder)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any error inside the user's module is theirs to see
        where = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name == module_name.split(".")[0]:
            where = (f" (searched the current folder, {os.getcwd()}, and the Python path: run "
                     "the command from the folder that holds it, or add that folder to "
                     "PYTHONPATH)")  # fmt: skip
        raise error(
            f"{key}: cannot import module {module_name!r}: {type(exc).__name__}: {exc}{where}"
        ) from None
    try:
        obj: Any = module
        for part in attribute.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise error(f"{key}: module {module_name!r} has no {attribute!r}") from None
    return obj


def code_dir_of(path: str) -> str | None:
    """The folder to put on sys.path for ``path``'s module (its top-level package's parent),
    once it is imported; None for a module without a file."""
    module = sys.modules.get(path.partition(":")[0])
    file = getattr(module, "__file__", None)
    if file is None:
        return None
    depth = path.partition(":")[0].count(".")
    return str(Path(file).resolve().parents[depth])


def with_code_dir(section: S, path: str | None) -> S:
    """``section`` (a dataclass with ``code_dir``) with the folder ``path``'s module was found
    in, once the driver's check imported it, so that workers Ray starts in other folders import
    it from there; unchanged where it already says one or names no user code (``path`` None)."""
    if path is None or getattr(section, "code_dir", None) is not None:
        return section
    return dataclasses.replace(section, code_dir=code_dir_of(path))  # type: ignore[type-var]


def takes(entry: Any, argument: str) -> bool:
    """Whether the callable ``entry`` has a parameter named ``argument`` (False where it has no
    signature to read, as some builtins)."""
    try:
        parameters = inspect.signature(entry).parameters
    except (TypeError, ValueError):
        return False
    return argument in parameters
