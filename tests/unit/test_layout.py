"""The house rules of the source tree, checked on the code itself: workers never import driver
modules, the core never imports a workload, no import cycles, and the worker's loop stays short
(``run`` at most 45 lines, no function in ``runtime/worker/`` over 60)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "runtime"
PACKAGE = "trainforge"
CORE = {"checkpoint", "distributed", "early_stopping", "optim", "precision", "profiling",
        "progress", "log", "atomic", "errors", "ray_compat", "resources", "plots",
        "data"}  # fmt: skip


def module_name(path: Path) -> str:
    parts = path.relative_to(SOURCE).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join((PACKAGE, *parts))


MODULES = {module_name(p): p for p in sorted(SOURCE.rglob("*.py"))}


def imports_of(name: str, top_level_only: bool = False) -> set[str]:
    """The trainforge modules ``name`` imports (each ``from a import b`` counts as ``a.b`` when
    that is a module, else ``a``); with ``top_level_only``, only imports run at import time."""
    tree = ast.parse(MODULES[name].read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith(PACKAGE)}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE):
            module = node.module or ""
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in MODULES else module)
    return {m for m in found if m in MODULES and m != name}


def test_modules_are_found() -> None:
    assert f"{PACKAGE}.worker.trainer" in MODULES and f"{PACKAGE}.driver.launch" in MODULES


@pytest.mark.parametrize("name", [m for m in MODULES if m.startswith(f"{PACKAGE}.worker")])
def test_workers_never_import_driver_modules(name: str) -> None:
    assert not {m for m in imports_of(name) if m.startswith(f"{PACKAGE}.driver")}


@pytest.mark.parametrize(
    "name", [m for m in MODULES if m.split(".")[1:2] and m.split(".")[1] in CORE]
)
def test_the_core_never_imports_a_workload_or_the_driver(name: str) -> None:
    banned = (f"{PACKAGE}.workloads", f"{PACKAGE}.driver", f"{PACKAGE}.worker")
    assert not {m for m in imports_of(name) if m.startswith(banned)}


def test_no_import_cycles() -> None:
    """Among imports run at import time (a function-level import is how a cycle is broken on
    purpose, and none is needed inside the package)."""
    graph = {name: imports_of(name, top_level_only=True) for name in MODULES}
    # a package's __init__ importing its own submodules is not a cycle with them
    for name, targets in graph.items():
        graph[name] = {t for t in targets if not name.startswith(t + ".")}
    visiting: list[str] = []
    done: set[str] = set()

    def visit(name: str) -> None:
        if name in done:
            return
        assert name not in visiting, " -> ".join([*visiting[visiting.index(name) :], name])
        visiting.append(name)
        for target in sorted(graph[name]):
            visit(target)
        visiting.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)


def function_lengths(path: Path) -> dict[str, int]:
    tree = ast.parse(path.read_text())
    lengths: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lengths[f"{path.name}:{node.lineno}:{node.name}"] = (
                (node.end_lineno or node.lineno) - start + 1
            )
    return lengths


def test_the_loop_reads_on_one_screen() -> None:
    lengths: dict[str, int] = {}
    for path in sorted((SOURCE / "worker").glob("*.py")):
        lengths |= function_lengths(path)
    (run,) = [
        n for name, n in lengths.items() if name.startswith("trainer.py:") and name.endswith(":run")
    ]
    assert run <= 45
    too_long = {name: n for name, n in lengths.items() if n > 60}
    assert not too_long
