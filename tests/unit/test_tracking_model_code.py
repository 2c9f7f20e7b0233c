"""The code a logged model ships (``tracking/model_code.py``): the modules its classes need,
not the whole package, and enough to load it where trainforge is not installed."""

from __future__ import annotations

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
    package = model_code.ship(model, tmp_path / "code")
    assert package is not None and package.name == "trainforge"
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
    assert model_code.ship(model, tmp_path) is None
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
