"""The code a logged model needs beside its weights (MLflow's ``code_paths``), so that it loads in
another process and folder, where trainforge is not installed and the user's project is not on
the path: the modules that define its classes — trainforge's own, and the user's
(``workload.model: my_nets:FlatNet``, a ``workload.kind: python`` workload's module) — and the
modules of trainforge and of the user's project that those import when imported.

trainforge's go under a folder named ``trainforge``, with the package's own ``__init__`` (it
imports the rest on first use only) and empty stand-ins for its other packages' (theirs import
the rest of trainforge); the user's keep their packages' own ``__init__`` files, which Python
runs on the way to a module. A simple CNN's model ships
~11 kB of code this way, not the whole package (0.9 MB).

MLflow puts a model's code folder first on sys.path when it loads the model in a process. There
the cut-down ``trainforge`` would hide an installed one from every import after it (``No module
named 'trainforge.workloads.base'``), so its ``__init__`` hands over to an installed trainforge
where there is one (``HAND_OVER``): one whole trainforge per process, the cut-down one only
where no other exists."""

from __future__ import annotations

import ast
import functools
import shutil
import site
import sys
import sysconfig
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

PACKAGE = "trainforge"
STAND_IN = '"""A stand-in for the package: only the modules the model needs ship with it."""\n'
SHIPPED = "SHIPPED_WITH_A_MODEL.txt"
"""The file that marks a cut-down trainforge, so that one copy never hands over to another."""
SHIPPED_TEXT = (
    "This trainforge holds only what a logged model needs; an installed one is used instead "
    "wherever there is one (trainforge.tracking.model_code).\n"
)
NOT_SHIPPED = ("__main__", "__mp_main__")  # a script's classes: MLflow's cloudpickle copies them

# Appended to the shipped copy of trainforge's __init__: the import system keeps whatever the
# module leaves in sys.modules under its name, so this copy can give way to the installed package.
HAND_OVER = f'''

# A copy shipped with a logged model (trainforge.tracking.model_code): where trainforge is
# installed, that package is imported in its place, whole.
def _installed_trainforge():
    import importlib.machinery
    import os
    import sys

    def usable(spec):
        origin = getattr(spec, "origin", None)
        return bool(origin and spec.loader and not os.path.exists(
            os.path.join(os.path.dirname(origin), "{SHIPPED}")))

    for finder in list(sys.meta_path):
        try:
            if finder is importlib.machinery.PathFinder:  # each folder on sys.path, in order
                specs = [finder.find_spec(__name__, [entry]) for entry in list(sys.path)]
            else:
                specs = [finder.find_spec(__name__, None)]
        except Exception:  # a finder of another kind, with another signature
            continue
        for spec in specs:
            if usable(spec):
                return spec
    return None


_installed = _installed_trainforge()
if _installed is not None:
    import importlib.util as _util
    import sys as _sys

    _module = _util.module_from_spec(_installed)
    _sys.modules[__name__] = _module
    _installed.loader.exec_module(_module)
'''


def ship(model: Any, folder: Path) -> list[Path]:
    """The code ``model``'s classes need (``ship_modules``), written under ``folder``."""
    return ship_modules({type(part).__module__ for part in model.modules()}, folder)


def ship_modules(roots: Iterable[str], folder: Path, inside_functions: bool = False) -> list[Path]:
    """The modules ``roots`` and what they import (``needed_modules``), written under
    ``folder``: a cut-down trainforge package, the user's module files and packages; the
    top-level files and folders written, for MLflow's ``code_paths`` (none where no root is
    trainforge's or the user's: a torchvision model)."""
    found = {name for name in roots if _source(name) is not None}
    tops: set[Path] = set()
    for name in sorted(needed_modules(found, inside_functions)):
        source = _source(name)
        assert source is not None, "needed_modules keeps only modules it found"
        target = folder.joinpath(*name.split("."))
        if source.name == "__init__.py":
            target = target / "__init__.py"
        else:
            target = target.with_suffix(".py")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)
        tops.add(folder / target.relative_to(folder).parts[0])
    package = folder / PACKAGE
    if package in tops:
        _cut_down(package)
    return sorted(tops)


def _cut_down(package: Path) -> None:
    """The shipped trainforge made a package that loads alone: its ``__init__`` (lazy: it
    imports no other module) handing over to an installed trainforge, its other packages'
    stand-ins, the mark of a shipped copy."""
    import trainforge

    init = Path(trainforge.__file__).read_text()
    (package / "__init__.py").write_text(init + HAND_OVER)
    (package / SHIPPED).write_text(SHIPPED_TEXT)
    for parent in (p for p in package.rglob("*") if p.is_dir()):
        if not (parent / "__init__.py").exists():
            (parent / "__init__.py").write_text(STAND_IN)


def needed_modules(roots: set[str], inside_functions: bool = False) -> set[str]:
    """``roots`` and every module of trainforge or of the user's project they import when
    imported (or anywhere, ``inside_functions``: a module whose functions run when a model
    loads), transitively; a user's module with its parent packages, whose ``__init__`` runs
    first. An import inside a function runs only when the function is called."""
    needed: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in needed:
            continue
        needed.add(name)
        parents = [] if _is_trainforge(name) else _parents(name)
        todo += sorted((_imported(name, inside_functions) | set(parents)) - needed)
    return {name for name in needed if _source(name) is not None}


def _imported(name: str, inside_functions: bool) -> set[str]:
    """The modules of trainforge or of the user's project that module ``name`` imports."""
    source = _source(name)
    assert source is not None, "only modules found are read"
    tree = ast.parse(source.read_text())
    package = name if source.name == "__init__.py" else name.rpartition(".")[0]
    aliases = {PACKAGE}  # the names `import trainforge` binds
    found: set[str] = set()
    nodes = list(_runs(tree, inside_functions))
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
            aliases |= {a.asname for a in node.names if a.name == PACKAGE and a.asname}
        elif isinstance(node, ast.ImportFrom):
            module = _absolute(node, package)
            for alias in node.names:
                # `from a.b import c`: c is a module of a.b, or a name that a.b defines
                submodule = f"{module}.{alias.name}"
                found.add(submodule if _source(submodule) is not None else module)
                if module == PACKAGE:
                    found |= _lazy({alias.name})
    # `trainforge.Workload` (a base class): trainforge's __init__ imports it on first use
    found |= _lazy({
        node.attr for node in nodes
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id in aliases
    })  # fmt: skip
    return {module for module in found if module != name and _source(module) is not None}


def _absolute(node: ast.ImportFrom, package: str) -> str:
    """The module a ``from … import`` names, its dots resolved against ``package``."""
    if node.level == 0:
        return node.module or ""
    base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
    return f"{base}.{node.module}" if node.module else base


def _lazy(names: set[str]) -> set[str]:
    """The modules of the names trainforge's ``__init__`` imports on first use."""
    import trainforge

    public: dict[str, str] = trainforge._PUBLIC
    return {public[name] for name in names if name in public}


def _runs(tree: ast.Module, inside_functions: bool) -> Iterator[ast.AST]:
    """The nodes of a module that run when it is imported (its functions' bodies too,
    ``inside_functions``), less those under ``if TYPE_CHECKING:``."""
    todo: list[ast.AST] = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            todo += node.orelse
            continue
        yield node
        if not inside_functions and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            # its decorators and default values run when it is defined
            defaults = [d for d in node.args.kw_defaults if d is not None]
            todo += [*node.decorator_list, *node.args.defaults, *defaults]
            continue
        todo += ast.iter_child_nodes(node)


def _parents(name: str) -> list[str]:
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def _is_trainforge(name: str) -> bool:
    return name == PACKAGE or name.startswith(f"{PACKAGE}.")


def _source(name: str) -> Path | None:
    """The file of module ``name``: trainforge's, or an imported module of the user's own
    project; None for any other (the standard library's, an installed package's, a name that
    is no module)."""
    if _is_trainforge(name):
        import trainforge

        path = Path(trainforge.__file__).parent.joinpath(*name.split(".")[1:])
        for candidate in (path / "__init__.py", path.with_suffix(".py")):
            if candidate.is_file():
                return candidate
        return None
    module = sys.modules.get(name)
    file = getattr(module, "__file__", None)
    if name in NOT_SHIPPED or not isinstance(file, str) or not file.endswith(".py"):
        return None
    path = Path(file)
    return path if _is_users(path) else None


def _is_users(path: Path) -> bool:
    """A file of the user's own code: not the standard library's, nor in a folder where
    packages are installed."""
    resolved = path.resolve()
    if {"site-packages", "dist-packages"} & set(resolved.parts):
        return False
    return not any(resolved.is_relative_to(folder) for folder in _installed_folders())


@functools.cache
def _installed_folders() -> list[Path]:
    paths = sysconfig.get_paths()
    folders = [paths[key] for key in ("stdlib", "platstdlib", "purelib", "platlib") if key in paths]
    folders += site.getsitepackages() if hasattr(site, "getsitepackages") else []
    return [Path(folder).resolve() for folder in folders]
