"""A user's own workload (``workload.kind: python``, ``trainforge.workloads.python``): the entry
imported by path and handed its checked settings, and the driver's probe that names, in one
line, each way a workload can break its contract before any worker starts."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from trainforge import config
from trainforge.errors import RecipeError, UserCodeError
from trainforge.workloads import build_workload, check_workload_data

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "wave"

# A user's module: a workload that keeps the contract, and one subclass per way to break it.
USER_MODULE = """
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import Dataset

import trainforge


@dataclass
class Settings:
    width: int = 4
    rows: int = 16


class Good(trainforge.Workload):
    Config = Settings

    def build_model(self):
        return nn.Linear(3, self.config.width)

    def datasets(self, device):
        x = torch.randn(self.config.rows, 3)
        return (x, torch.randn(self.config.rows, self.config.width)), (x[:4], x[:4, :1])

    def loss(self, model, batch):
        x, y = batch
        return ((model(x) - y) ** 2).mean()


class Untyped(Good):
    Config = None  # its settings come as the recipe's mapping


def takes_seed(config, seed):
    workload = Good(Settings(**config))
    workload.seed = seed
    return workload


class Named(Good):
    model_name = "wave_mlp_v2"


class NotAWorkload:
    def __init__(self, config):
        pass


class Raises(Good):
    def __init__(self, config, seed):
        raise ValueError("no such data set 'x'")


class NotAModule(Good):
    def build_model(self):
        return "a model"


class OneSplit(Good):
    def datasets(self, device):
        return torch.zeros(4, 3)


class Ragged(Good):
    def datasets(self, device):
        return (torch.zeros(4, 3), torch.zeros(5, 4)), (torch.zeros(2, 3), torch.zeros(2, 4))


class Empty(Good):
    def datasets(self, device):
        return (torch.zeros(0, 3), torch.zeros(0, 4)), (torch.zeros(2, 3), torch.zeros(2, 4))


class Items(Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return {"x": torch.zeros(3)}


class DictItems(Good):
    def datasets(self, device):
        return Items(), Items()


class PerSampleLoss(Good):
    def loss(self, model, batch):
        x, y = batch
        return ((model(x) - y) ** 2).mean(dim=1)


class NoGradient(Good):
    def loss(self, model, batch):
        return torch.tensor(1.0)


class WrongShape(Good):
    def build_model(self):
        return nn.Linear(7, self.config.width)


class FloatSums(Good):
    def eval_sums(self, model, batch):
        return 1.5


class ListMetrics(Good):
    def summarize(self, sums):
        return [1.0]
"""


@pytest.fixture
def user_module(importable_module: Callable[[str, str], str]) -> str:
    return importable_module("user_workload", USER_MODULE)


def _recipe(entry: str, **settings: object) -> config.Recipe:
    data = {"run": {"name": "mine"}, "train": {"batch_size": 2},
            "workload": {"kind": "python", "entry": entry, "config": settings}}  # fmt: skip
    return config.from_container(data)


def test_a_workload_that_keeps_the_contract_is_built_with_its_checked_settings(
    user_module: str,
) -> None:
    cfg = _recipe(f"{user_module}:Good", width=6)
    check_workload_data(cfg.workload)  # the probe passes
    workload = build_workload(cfg.workload, seed=7, precision=cfg.precision)
    assert type(workload.config).__name__ == "Settings"
    assert (workload.config.width, workload.config.rows, workload.seed) == (6, 16, 7)
    assert workload.model_name == "good"  # MLflow's name for it: the class's, unless it sets one
    model = workload.build_model()
    train, _ = workload.datasets(torch.device("cpu"))
    # the default validation: the mean loss over the samples, as val/loss
    sums = workload.eval_sums(model, train)
    assert set(workload.summarize(sums)) == {"val/loss"}
    assert workload.summarize(sums)["val/loss"] == pytest.approx(workload.loss(model, train).item())


def test_settings_without_a_config_class_arrive_as_the_recipes_mapping(user_module: str) -> None:
    cfg = _recipe(f"{user_module}:Untyped", width=5, layers=[8, 8], block={"norm": "layer"})
    workload = build_workload(cfg.workload, seed=0, precision=cfg.precision)
    assert workload.config == {"width": 5, "layers": [8, 8], "block": {"norm": "layer"}}
    cfg = _recipe(f"{user_module}:takes_seed")  # a function; it takes the seed by name
    made = build_workload(cfg.workload, seed=3, precision=cfg.precision)
    assert (made.seed, made.model_name) == (3, "good")
    named = build_workload(_recipe(f"{user_module}:Named").workload, 0, cfg.precision)
    assert named.model_name == "wave_mlp_v2"


@pytest.mark.parametrize(
    ("entry", "settings", "message"),
    [
        (
            "Good",
            {"widht": 3},
            "workload.config.widht: unknown key (did you mean 'workload.config.width'?)",
        ),
        ("Good", {"width": "wide"}, "workload.config.width: "),
        (
            "NotAWorkload",
            {},
            ":NotAWorkload(config) returned NotAWorkload, not a trainforge.Workload",
        ),
        ("Raises", {}, ":Raises(config) raised ValueError: no such data set 'x'"),
        ("Settings.width", {}, "is int, not a trainforge.Workload subclass or a function"),
        ("Missing", {}, "has no 'Missing'"),
        ("NotAModule", {}, ".build_model() returned str, not a torch.nn.Module"),
        (
            "OneSplit",
            {},
            ".datasets(device) returned Tensor: expected (training split, validation split)",
        ),
        ("Ragged", {}, "TensorData's tensors differ in length: [4, 5]"),
        ("Empty", {}, "the training split is empty"),
        ("DictItems", {}, "the training Dataset's items are dict: expected tuples of tensors"),
        ("PerSampleLoss", {}, ".loss(model, batch) returned (2,): expected the batch's mean loss"),
        ("NoGradient", {}, ".loss(model, batch) does not depend on the model's parameters"),
        ("WrongShape", {}, ".loss(model, batch) raised RuntimeError: mat1 and mat2 shapes"),
        ("FloatSums", {}, ".eval_sums(model, batch) returned float: expected a dict of tensors"),
        ("ListMetrics", {}, ".summarize(sums) returned [1.0]: expected a dict of metric names"),
    ],
)
def test_each_broken_contract_is_one_line_naming_the_entry(
    user_module: str, entry: str, settings: dict[str, object], message: str
) -> None:
    with pytest.raises(RecipeError, match=re.escape(message)) as caught:
        check_workload_data(_recipe(f"{user_module}:{entry}", **settings).workload)
    assert "\n" not in str(caught.value)
    assert str(caught.value).startswith(("workload.entry: ", "workload.config."))


def test_a_module_that_is_not_there_is_named_with_where_it_was_looked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserCodeError, match=r"workload\.entry: cannot import module 'no_such_"):
        check_workload_data(_recipe("no_such_user_module:Thing").workload)
    with pytest.raises(RecipeError, match=r"workload\.entry: missing required value"):
        config.from_container({"run": {"name": "x"}, "workload": {"kind": "python"}})


def test_a_broken_workload_stops_the_command_in_one_line_before_any_worker(
    tmp_path: Path,
) -> None:
    """`validate` of a settings key the workload's Config lacks, and `train` and `validate` of
    the example with its loss broken: exit 2, one line naming the key or the entry and what
    was expected, no traceback, no run folder and no MLflow store written."""
    project = tmp_path / "project"
    project.mkdir()
    source = (EXAMPLE / "wave_task.py").read_text()
    broken = source.replace("return nn.functional.mse_loss(model(x), y)",
                            "return (model(x) - y).pow(2)")  # fmt: skip
    assert broken != source
    (project / "wave_task.py").write_text(broken)
    (project / "recipe.yaml").write_text((EXAMPLE / "recipe.yaml").read_text())
    refused = subprocess.run(
        [sys.executable, "-m", "trainforge", "validate", "recipe.yaml", "workload.config.hiden=3"],
        cwd=project, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert refused.returncode == 2 and refused.stderr.strip() == (
        "trainforge: error: workload.config.hiden: unknown key (did you mean "
        "'workload.config.hidden'?)"
    ), refused.stderr
    for command in ("validate", "train"):
        done = subprocess.run(
            [sys.executable, "-m", "trainforge", command, "recipe.yaml"],
            cwd=project, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
        errors = [line for line in done.stderr.splitlines() if line.strip()]
        assert errors == [
            "trainforge: error: workload.entry: wave_task:WaveRegression.loss(model, batch) "
            "returned (2, 1): expected the batch's mean loss, a floating-point tensor of one "
            "element"
        ], done.stderr
    written = {p.name for p in project.iterdir()} - {"__pycache__"}  # Python's own, maybe
    assert written <= {"recipe.yaml", "wave_task.py", "runs"}
    assert not any((project / "runs").rglob("*"))  # no run folder, no lock left (no store)
