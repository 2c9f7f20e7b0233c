"""The code a logged model ships (``tracking/model_code.py``): the modules its classes need,
trainforge's and the user's own, not the whole package nor the user's project, and enough to
load it in another process and folder where neither is on the path; loaded in a process where
trainforge is installed, the installed package is the one imported, whole."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainforge.tracking import model_code
from trainforge.workloads.cnn.config import CNNWorkloadConfig
from trainforge.workloads.cnn.models import build_model
from trainforge.workloads.cnn.workload import CNNWorkload

# unpickled in a process whose only trainforge is the shipped folder (the editable install's
# finder taken out): the classes' modules import
UNPICKLE = """
import importlib.util, pickle, sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in f.__module__]
sys.path.insert(0, sys.argv[1])
import torch
model = torch.load(sys.argv[2], weights_only=False)
print(type(model).__name__, tuple(model(torch.randn(2, 3, 32, 32)).shape))
"""


@pytest.mark.parametrize("name", ["simple_cnn", "resnet18_cifar"])
def test_a_cnn_model_ships_only_the_modules_its_classes_import(tmp_path: Path, name: str) -> None:
    model = build_model(name, 3, 10, 32)
    [package] = model_code.ship(model, tmp_path / "code")
    assert package.name == "trainforge"
    shipped = sorted(str(f.relative_to(package)) for f in package.rglob("*.py"))
    assert shipped == ["__init__.py", "errors.py", "workloads/__init__.py",
                       "workloads/cnn/__init__.py", "workloads/cnn/models.py"]  # fmt: skip
    # the packages' own __init__ files import the rest of trainforge: stand-ins instead
    assert (package / "workloads" / "__init__.py").read_text() == model_code.STAND_IN
    torch.save(model, tmp_path / "model.pt")
    loaded = subprocess.run(
        [sys.executable, "-c", UNPICKLE, str(tmp_path / "code"), str(tmp_path / "model.pt")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env={"PATH": "/usr/bin"},
    )  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.split(" ", 1) == [type(model).__name__, "(2, 10)\n"]


def test_a_model_of_no_trainforge_class_ships_no_code(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 2))
    assert model_code.ship(model, tmp_path) == []
    assert list(tmp_path.iterdir()) == []


def test_a_cnn_workloads_model_is_named_after_the_recipes_model() -> None:
    named = {
        model: CNNWorkload(CNNWorkloadConfig(model=model), seed=0).model_name
        for model in ("simple_cnn", "resnet18_cifar", "torchvision:resnet50")
    }
    assert named == {"simple_cnn": "simple_cnn", "resnet18_cifar": "resnet18_cifar",
                     "torchvision:resnet50": "resnet50"}  # fmt: skip


def test_a_model_is_linked_to_the_evaluations_metrics_only() -> None:
    from trainforge.tracking.model_logging import ModelRecord

    latest = {key: (key, 1.0, 1000, 40) for key in (
        "val/loss", "val/accuracy", "final/val/loss", "c2st/mean", "sbc/ks_pvalue_min",
        "train/loss", "perf/samples_per_s", "sys/gpu_mem_gb", "run/restarts", "epoch")}  # fmt: skip
    record = ModelRecord.of("posterior", latest)
    assert [row[0] for row in record.metrics] == [
        "c2st/mean", "final/val/loss", "sbc/ks_pvalue_min", "val/accuracy", "val/loss"]  # fmt: skip
    assert (record.name, record.step, ModelRecord().step) == ("posterior", 40, 0)


# A user's project: a package whose module holds the model's class (a relative import, its
# __init__ importing a sibling), a top-level module of the project that imports trainforge and
# subclasses trainforge.Workload (as a `workload.kind: python` module does), and what the
# model does not need
PROJECT = {
    "my_pkg/__init__.py": "from my_pkg.version import VERSION  # noqa: F401\n",
    "my_pkg/version.py": "VERSION = '1'\n",
    "my_pkg/layers.py": """
from torch import nn


class Block(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, 2, 3, padding=1)

    def forward(self, x):
        return self.conv(x).relu()
""",
    "my_pkg/nets.py": """
from torch import nn

import my_head
from .layers import Block


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block(1)
        self.head = my_head.Head(2 * 8 * 8, 3)

    def forward(self, x):
        return self.head(self.block(x))
""",
    "my_pkg/unused.py": "import my_pkg.nets  # noqa: F401\n",
    "my_head.py": """
from torch import nn

import trainforge


class Head(nn.Module):
    def __init__(self, features, classes):
        super().__init__()
        self.layer = nn.Linear(features, classes)

    def forward(self, x):
        return self.layer(x.flatten(1))


class HeadTask(trainforge.Workload):
    def build_model(self):
        return Head(4, 2)
""",
    "unrelated.py": "raise RuntimeError('not for the model')\n",
    "data.txt": "not code\n",
}
SHIPPED_USERS = ["my_head.py", "my_pkg/__init__.py", "my_pkg/layers.py", "my_pkg/nets.py",
                 "my_pkg/version.py"]  # fmt: skip

# The logged model loaded by MLflow's URI in a new process: what could be imported before, the
# model's output, and where the modules it brought came from. `isolated`: the editable
# install's finder taken out (the environment has no PYTHONPATH): trainforge is importable only
# from the model's code
LOAD = """
import importlib.util, json, sys
uri, isolated, side = sys.argv[1], sys.argv[2] == "isolated", int(sys.argv[3])
if isolated:
    sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in f.__module__]
names = ["trainforge", "my_pkg", "my_head"]
before = [name for name in names if importlib.util.find_spec(name) is not None]
import mlflow.pytorch, torch
model = mlflow.pytorch.load_model(uri)
output = model(torch.ones(2, 1, side, side)).tolist()
import trainforge.workloads.base  # all of trainforge, where it is installed
files = {name: sys.modules[name].__file__ for name in
         [*names, "trainforge.workloads.base", "trainforge.workloads.spec"] if name in sys.modules}
print(json.dumps({"before": before, "output": output, "files": files}))
"""


def _project(folder: Path) -> None:
    for name, text in PROJECT.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)


def _logged(model: torch.nn.Module, tmp_path: Path, side: int = 8) -> str:
    """``model`` logged as a run's model by ``model_logging.log``: its ``models:/`` URI."""
    import mlflow

    from trainforge.tracking import model_logging
    from trainforge.tracking.client import RunHandle

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = mlflow.MlflowClient(uri)
    experiment = client.create_experiment("e", artifact_location=str(tmp_path / "artifacts"))
    run_id = client.create_run(experiment).info.run_id
    handle = RunHandle(uri, "e", "r", run_id, False, str(tmp_path / "spool.jsonl"))
    example = torch.ones(2, 1, side, side)
    assert model_logging.log(handle, *model_logging.for_mlflow(model, example))
    [logged] = client.search_logged_models(experiment_ids=[experiment])
    return f"models:/{logged.model_id}"


def _load(uri: str, tmp_path: Path, isolated: bool, side: int = 8) -> dict:
    """``LOAD`` in a new process, in a folder of its own."""
    import json
    import os

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    keep = ("PATH", "HOME", "OMP_NUM_THREADS", "MLFLOW_DISABLE_TELEMETRY")
    env = {key: os.environ[key] for key in keep if key in os.environ}
    if not isolated:
        env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{tmp_path / 'mlflow.db'}"
    loaded = subprocess.run(
        [sys.executable, "-c", LOAD, uri, "isolated" if isolated else "installed", str(side)],
        capture_output=True, text=True, timeout=300, cwd=elsewhere, env=env,
    )  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    return json.loads(loaded.stdout.splitlines()[-1])


def test_a_users_model_ships_its_modules_and_loads_where_neither_they_nor_trainforge_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The model's classes come from the user's package and module: those ship (the package's
    modules the classes need, its __init__ and what that imports, not the rest of the project),
    and so do the trainforge modules the user's module imports (``trainforge.Workload``)."""
    project = tmp_path / "project"
    _project(project)
    monkeypatch.syspath_prepend(str(project))
    import importlib

    try:
        model = importlib.import_module("my_pkg.nets").Net().eval()
        code = model_code.ship(model, tmp_path / "code")
        uri = _logged(model, tmp_path)
    finally:
        for name in ("my_pkg", "my_pkg.version", "my_pkg.layers", "my_pkg.nets", "my_head"):
            sys.modules.pop(name, None)
    assert [path.name for path in code] == ["my_head.py", "my_pkg", "trainforge"]
    shipped = sorted(str(f.relative_to(tmp_path / "code")) for f in (tmp_path / "code").rglob("*")
                     if f.is_file())  # fmt: skip
    assert [f for f in shipped if not f.startswith("trainforge/")] == SHIPPED_USERS
    # trainforge.Workload's module and what it imports, nothing of the driver or the CLI
    assert "trainforge/workloads/base.py" in shipped
    assert not any(f.startswith(("trainforge/driver/", "trainforge/cli")) for f in shipped)
    with torch.no_grad():
        expected = model(torch.ones(2, 1, 8, 8)).tolist()
    project.rename(tmp_path / "moved")  # nowhere to import the user's modules from but the model

    said = _load(uri, tmp_path, isolated=True)
    assert said["before"] == []
    torch.testing.assert_close(torch.tensor(said["output"]), torch.tensor(expected))
    # every module it brought is the model's own copy, trainforge's included
    for name, file in said["files"].items():
        assert f"{os.sep}code{os.sep}" in file and "elsewhere" not in file, (name, file)


def test_a_model_loaded_where_trainforge_is_installed_leaves_all_of_trainforge_importable(
    tmp_path: Path,
) -> None:
    """MLflow puts the model's code folder, a cut-down trainforge, first on the process's
    path; the installed trainforge is the one imported, whole (``trainforge.workloads.spec``
    never ships with a model)."""
    import trainforge

    uri = _logged(build_model("simple_cnn", 1, 3, 16).eval(), tmp_path, side=16)
    said = _load(uri, tmp_path, isolated=False, side=16)
    installed = str(Path(trainforge.__file__).parent)
    assert said["files"]["trainforge"] == trainforge.__file__
    assert said["files"]["trainforge.workloads.spec"].startswith(installed)
    assert said["files"]["trainforge.workloads.base"].startswith(installed)
    assert len(said["output"]) == 2


# Two models' code folders on the path of a process with no trainforge installed: the first
# copy serves (neither hands over to the other)
TWO_COPIES = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in f.__module__]
sys.path[:0] = sys.argv[1:3]
import trainforge.workloads.cnn.models
print(trainforge.__file__)
"""


def test_two_shipped_copies_on_the_path_load_without_an_installed_trainforge(
    tmp_path: Path,
) -> None:
    model = build_model("simple_cnn", 3, 10, 32)
    folders = [tmp_path / "first", tmp_path / "second"]
    for folder in folders:
        model_code.ship(model, folder)
    loaded = subprocess.run(
        [sys.executable, "-c", TWO_COPIES, *map(str, folders)],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env={"PATH": "/usr/bin"},
    )  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr[-2000:]
    assert loaded.stdout.strip() == str(folders[0] / "trainforge" / "__init__.py")
