"""The house rules of the source tree, checked on the code itself, each rule a function that lists
its violations in a tree of modules. Every rule holds on ``runtime/``, and each one finds the
violation planted in a small tree of its own (a rule that cannot fail checks nothing):

- workers never import the driver, nor the driver's side of tracking;
- the core (config, data, worker, tracking, checkpoint, …) never imports a workload family; the
  driver and the CLI reach families only through the registry (``trainforge.workloads``);
- a workload family never imports the driver or the worker side, nor Ray, ``subprocess`` or
  ``multiprocessing``: it hands its work to the driver's runners (``workloads/stage.py``);
- the shared tracking parts know neither the driver's side nor the worker's;
- no import cycle, counting imports inside functions (not those for type checking only);
- every ``TRAINFORGE_*`` setting is named in ``settings.py`` alone, and no production module
  reads the tests' fault variables;
- the loop reads on one screen (``trainer.run`` ≤ 45 lines), so does one run of a worker group
  (``run.run_workers`` ≤ 45), and no function of the driver or the worker is over 60 lines;
  ``workloads/sbi/simulate.py`` stays under 400 lines.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

SOURCE = Path(__file__).resolve().parents[2] / "runtime"
PACKAGE = "trainforge"
CORE = ("config", "data", "worker", "tracking", "checkpoint", "precision", "distributed",
        "early_stopping", "optim", "profiling", "progress", "progress_events", "log", "atomic",
        "errors", "ray_compat", "resources", "plots", "settings", "storage",
        "gradient_averaging")  # fmt: skip
SHARED_TRACKING = ("client", "spool", "datasets", "new_store", "system_metrics", "model_logging",
                   "model_code")  # fmt: skip
LAUNCHING = ("ray", "subprocess", "multiprocessing")
LAUNCHING_ALLOWED = {
    # a one-off `pip download` of sbibm's wheel, the data's source: no worker, no pool
    "trainforge.workloads.sbi.sbibm_data": {"subprocess"},
}
SETTING = re.compile(r"^TRAINFORGE_[A-Z0-9_]+$")
TEST_ONLY = re.compile(r"TRAINFORGE_TEST_")


@dataclass
class Module:
    name: str
    path: Path
    tree: ast.Module


class Tree:
    """The modules under a source folder that installs as ``trainforge``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.modules: dict[str, Module] = {}
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join((PACKAGE, *parts))
            self.modules[name] = Module(name, path, ast.parse(path.read_text()))

    def imports(self, name: str, top_level_only: bool = False) -> set[str]:
        """The trainforge modules ``name`` imports (``from a import b`` counts as ``a.b`` where
        that is a module), at import time only or anywhere; never those under
        ``if TYPE_CHECKING:``."""
        return {m for m in self._imported(name, top_level_only) if m in self.modules and m != name}

    def external(self, name: str) -> set[str]:
        """The top-level packages outside trainforge that ``name`` imports anywhere."""
        return {m.split(".")[0] for m in self._imported(name) if not m.startswith(PACKAGE)}

    def _imported(self, name: str, top_level_only: bool = False) -> set[str]:
        found: set[str] = set()
        for node in _runtime_nodes(self.modules[name].tree, top_level_only):
            if isinstance(node, ast.Import):
                found |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    sub = f"{node.module}.{alias.name}"
                    found.add(sub if sub in self.modules else node.module)
        return found


def _runtime_nodes(tree: ast.Module, top_level_only: bool) -> list[ast.AST]:
    """The nodes run at import time (``top_level_only``) or anywhere, less the bodies of
    ``if TYPE_CHECKING:``."""
    nodes: list[ast.AST] = []
    stack: list[ast.AST] = list(tree.body)
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            stack.extend(node.orelse)
            continue
        nodes.append(node)
        if top_level_only and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        stack.extend(ast.iter_child_nodes(node))
    return nodes


def layer(name: str) -> str:
    return [*name.split("."), ""][1]


def is_family(tree: Tree, name: str) -> bool:
    """A module of a workload family: a package under ``trainforge.workloads``."""
    parts = name.split(".")
    return (
        len(parts) >= 3
        and parts[1] == "workloads"
        and (
            f"{PACKAGE}.workloads.{parts[2]}" in tree.modules
            and tree.modules[f"{PACKAGE}.workloads.{parts[2]}"].path.name == "__init__.py"
        )
    )


def workers_importing_the_driver(tree: Tree) -> list[str]:
    banned = (f"{PACKAGE}.driver", f"{PACKAGE}.tracking.driver")
    return [f"{n} imports {m}" for n in tree.modules if layer(n) == "worker"
            for m in tree.imports(n) if m == banned[1] or m.startswith(banned[0] + ".")
            or m == banned[0]]  # fmt: skip


def core_importing_a_family(tree: Tree) -> list[str]:
    return [f"{n} imports {m}" for n in tree.modules if layer(n) in CORE
            for m in tree.imports(n) if is_family(tree, m)]  # fmt: skip


def driver_importing_a_family(tree: Tree) -> list[str]:
    return [f"{n} imports {m}" for n in tree.modules if layer(n) in ("driver", "cli")
            for m in tree.imports(n) if is_family(tree, m)]  # fmt: skip


def families_starting_processes(tree: Tree) -> list[str]:
    found = []
    for name in tree.modules:
        if not is_family(tree, name):
            continue
        found += [f"{name} imports {m}" for m in tree.imports(name)
                  if layer(m) in ("driver", "worker")]  # fmt: skip
        allowed = LAUNCHING_ALLOWED.get(name, set())
        found += [f"{name} imports {m}" for m in tree.external(name)
                  if m in LAUNCHING and m not in allowed]  # fmt: skip
    return found


def shared_tracking_knowing_sides(tree: Tree) -> list[str]:
    shared = {f"{PACKAGE}.tracking.{part}" for part in SHARED_TRACKING}
    sides = (f"{PACKAGE}.tracking.driver", f"{PACKAGE}.tracking.worker")
    return [f"{n} imports {m}" for n in tree.modules if n in shared for m in tree.imports(n)
            if m in sides or layer(m) in ("driver", "worker")]  # fmt: skip


def import_cycles(tree: Tree) -> list[str]:
    """Each cycle once, as a path through it (imports inside functions count)."""
    graph = {name: tree.imports(name) for name in tree.modules}
    for name, targets in graph.items():  # a package importing its own submodules is no cycle
        graph[name] = {t for t in targets if not name.startswith(t + ".")}
    cycles, done, visiting = [], set(), []

    def visit(name: str) -> None:
        if name in done:
            return
        if name in visiting:
            cycles.append(" -> ".join([*visiting[visiting.index(name) :], name]))
            return
        visiting.append(name)
        for target in sorted(graph[name]):
            visit(target)
        visiting.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)
    return cycles


def strings(module: Module) -> list[str]:
    """The module's string constants, less its docstrings."""
    docstrings = set()
    for node in ast.walk(module.tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            docstrings.add(id(first.value))
    return [node.value for node in ast.walk(module.tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in docstrings]  # fmt: skip


def settings_named_elsewhere(tree: Tree) -> list[str]:
    home = f"{PACKAGE}.settings"
    return [f"{n} names {s}" for n, m in tree.modules.items() if n != home
            for s in strings(m) if SETTING.match(s)]  # fmt: skip


def fault_variables_read(tree: Tree) -> list[str]:
    return [f"{n} names {s}" for n, m in tree.modules.items()
            for s in strings(m) if TEST_ONLY.search(s)]  # fmt: skip


def function_lengths(module: Module) -> dict[str, int]:
    lengths = {}
    for node in ast.walk(module.tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            start = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            lengths[f"{module.name}:{node.lineno}:{node.name}"] = (
                (node.end_lineno or node.lineno) - start + 1
            )
    return lengths


def too_long(tree: Tree) -> list[str]:
    found = []
    for name, module in tree.modules.items():
        lengths = function_lengths(module)
        if layer(name) in ("driver", "worker"):
            found += [f"{where}: {n} lines" for where, n in lengths.items() if n > 60]
        for short in (f"{PACKAGE}.worker.trainer:run", f"{PACKAGE}.driver.run:run_workers"):
            module_name, function = short.split(":")
            found += [f"{where}: {n} lines" for where, n in lengths.items() if n > 45
                      and name == module_name and where.endswith(f":{function}")]  # fmt: skip
    simulate = tree.modules.get(f"{PACKAGE}.workloads.sbi.simulate")
    if simulate is not None and len(simulate.path.read_text().splitlines()) >= 400:
        found.append(f"{simulate.path}: 400 lines or more")
    return found


RULES: list[Callable[[Tree], list[str]]] = [
    workers_importing_the_driver, core_importing_a_family, driver_importing_a_family,
    families_starting_processes, shared_tracking_knowing_sides, import_cycles,
    settings_named_elsewhere, fault_variables_read, too_long,
]  # fmt: skip


@pytest.fixture(scope="module")
def runtime() -> Tree:
    return Tree(SOURCE)


def test_the_tree_is_read(runtime: Tree) -> None:
    assert f"{PACKAGE}.worker.trainer" in runtime.modules
    assert is_family(runtime, f"{PACKAGE}.workloads.sbi.simulate")
    assert not is_family(runtime, f"{PACKAGE}.workloads.spec")


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.__name__)
def test_the_rule_holds(rule: Callable[[Tree], list[str]], runtime: Tree) -> None:
    assert rule(runtime) == []


PLANTED = {
    workers_importing_the_driver: {"worker/loop.py": "from trainforge.driver import launch\n",
                                   "driver/launch.py": ""},
    core_importing_a_family: {"config/load.py": "def f():\n    import trainforge.workloads.cnn\n",
                              "workloads/cnn/__init__.py": ""},
    driver_importing_a_family: {"cli.py": "from trainforge.workloads.sbi import ensemble\n",
                                "workloads/sbi/__init__.py": "", "workloads/sbi/ensemble.py": ""},
    families_starting_processes: {"workloads/sbi/__init__.py": "",
                                  "workloads/sbi/simulate.py": "import subprocess\n"},
    shared_tracking_knowing_sides: {"tracking/driver.py": "",
                                    "tracking/client.py": "from trainforge.tracking import driver"},
    import_cycles: {"a.py": "import trainforge.b\n",
                    "b.py": "def f():\n    from trainforge import a\n"},
    settings_named_elsewhere: {"driver/pool.py": "import os\nos.environ.get('TRAINFORGE_POOL')\n"},
    fault_variables_read: {"worker/step.py": "FAULT = 'TRAINFORGE_TEST_HANG_AT_STEP'\n"},
    too_long: {"driver/run.py": "def run_workers():\n" + "    x = 1\n" * 45},
}  # fmt: skip


@pytest.mark.parametrize("rule", RULES, ids=lambda rule: rule.__name__)
def test_a_planted_violation_fails_the_rule(
    rule: Callable[[Tree], list[str]], tmp_path: Path
) -> None:
    for relative, text in PLANTED[rule].items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        for folder in [p for p in path.parents if p != tmp_path and tmp_path in p.parents]:
            (folder / "__init__.py").touch()
        path.write_text(text)
    assert rule(Tree(tmp_path)) != []


def test_imports_for_type_checking_only_are_no_cycle(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("import trainforge.b\n")
    (tmp_path / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from trainforge import a\n"
    )
    assert import_cycles(Tree(tmp_path)) == []
