"""The part of trainforge that a logged model's classes need, shipped beside its weights
(MLflow's ``code_paths``), so that it loads where trainforge is not installed: the modules that
define them and the trainforge modules those import when imported, under a folder named
``trainforge`` whose other packages are empty stand-ins (their real ``__init__`` imports the
rest of trainforge). A simple CNN's model ships ~10 kB of code this way, not the whole package
(1.1 MB)."""

from __future__ import annotations

import ast
import shutil
from pathlib import Path
from typing import Any

PACKAGE = "trainforge"
STAND_IN = '"""A stand-in for the package: only the modules the model needs ship with it."""\n'


def ship(model: Any, folder: Path) -> Path | None:
    """The trainforge package cut down to what ``model``'s classes need, written under
    ``folder``; None where none of its classes is trainforge's (a torchvision model)."""
    roots = {type(part).__module__ for part in model.modules()}
    needed = needed_modules({name for name in roots if _source(name) is not None})
    if not needed:
        return None
    package = folder / PACKAGE
    for name in sorted(needed):
        source = _source(name)
        assert source is not None, "needed_modules keeps only modules found in the package"
        target = package.joinpath(*name.split(".")[1:])
        is_package = source.name == "__init__.py"
        target = target / "__init__.py" if is_package else target.with_suffix(".py")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
    for parent in [package, *(p for p in package.rglob("*") if p.is_dir())]:
        init = parent / "__init__.py"
        if not init.exists():
            init.write_text(STAND_IN)
    return package


def needed_modules(roots: set[str]) -> set[str]:
    """``roots`` and every trainforge module they import at their top level, transitively
    (an import inside a function runs only when it is called: not when the model loads)."""
    needed: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        todo += sorted(_imported(name) - needed)
    return needed


def _imported(name: str) -> set[str]:
    """The trainforge modules that module ``name`` imports at its top level."""
    source = _source(name)
    assert source is not None, "only modules found in the package are read"
    found: set[str] = set()
    for node in ast.parse(source.read_text()).body:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from a.b import c`: c may be a module of a.b or a name defined in it
            found |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    return {module for module in found if _source(module) is not None}


def _source(name: str) -> Path | None:
    """The file of trainforge's module ``name``; None for a module outside the package (or a
    name that is no module of it)."""
    if name != PACKAGE and not name.startswith(f"{PACKAGE}."):
        return None
    import trainforge

    path = Path(trainforge.__file__).parent.joinpath(*name.split(".")[1:])
    for candidate in (path / "__init__.py", path.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None
