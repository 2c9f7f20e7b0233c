"""trainforge.workloads: the registry of workload specs, and the base class whose hooks the
training loop calls without probing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from trainforge import config
from trainforge.data.types import Batch, Split, TensorData
from trainforge.errors import RecipeError
from trainforge.workloads import (
    FAMILIES,
    build_workload,
    check_workload_data,
    resolve_workload,
    spec_for,
)
from trainforge.workloads.base import Workload
from trainforge.workloads.cnn.config import CNNWorkloadConfig
from trainforge.workloads.cnn.workload import CNNWorkload
from trainforge.workloads.sbi.config import SBIWorkloadConfig
from trainforge.workloads.sbi.workload import SBIWorkload
from trainforge.workloads.spec import WorkloadSpec

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "recipes" / "cnn" / "digits_simple_cnn.yaml"
CIFAR10 = REPO / "recipes" / "cnn" / "cifar10_resnet18.yaml"
SBI_DEBUG = REPO / "recipes" / "sbi" / "two_moons_debug.yaml"


@pytest.mark.parametrize("kind", sorted(FAMILIES))
def test_every_family_exports_one_spec_of_its_kind(kind: str) -> None:
    spec = spec_for(kind)
    assert isinstance(spec, WorkloadSpec) and spec.kind == kind
    assert spec.schema().kind == kind  # the schema's default tag selects it


def test_unknown_kind_suggests_a_known_one() -> None:
    with pytest.raises(RecipeError, match=r"workload\.kind: unknown workload 'sbj'.*'sbi'"):
        spec_for("sbj")


def test_only_sbi_has_a_data_stage() -> None:
    """SBI simulates; a CNN recipe with a built-in model leaves resolving unchanged (one whose
    model is the user's own gets the folder its module came from)."""
    assert spec_for("cnn").start_data is None and spec_for("python").start_data is None
    assert spec_for("sbi").start_data is not None and spec_for("sbi").prepare_data is not None
    cnn = config.load(DIGITS).workload
    assert resolve_workload(cnn, seed=0, storage_root="/nowhere") is cnn


class Minimal(Workload):
    """Only the required methods: every optional hook comes from the base class."""

    def build_model(self) -> nn.Module:
        return nn.Linear(2, 1)

    def datasets(self, device: torch.device) -> tuple[Split, Split]:
        data = TensorData(torch.zeros(4, 2), torch.zeros(4, 1))
        return data, data

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        features, values = batch
        return (model(features) - values).pow(2).mean()

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        return {"loss_sum": self.loss(model, batch) * len(batch[0])}

    def summarize(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        return {"val/loss": float(sums["loss_sum"])}


def test_optional_hooks_have_defaults(tmp_path: Path) -> None:
    workload = Minimal()
    assert workload.eval_batch_size is None
    assert (workload.loader_workers, workload.pin_memory, workload.finish) == (0, False, None)
    batch = (torch.ones(3, 2), torch.ones(3, 1))
    assert workload.prepare_batch(batch, train=True) is batch
    assert workload.write_figures({}, tmp_path) == []
    assert workload.describe() == {}


def test_the_cnn_workload_names_its_batch_and_prepares_the_images_only() -> None:
    cfg = config.load(DIGITS, ["workload.augment=true"])
    workload = CNNWorkload(cfg.workload, seed=0, channels_last=True)  # type: ignore[arg-type]
    _, val = workload.datasets(torch.device("cpu"))
    model = workload.build_model()
    assert isinstance(val, TensorData)
    batch = (val.tensors[0][:8], val.tensors[1][:8])  # (images, labels)
    images, labels = workload.prepare_batch(batch, train=True)
    assert labels is batch[1] and images.shape == batch[0].shape
    assert images.is_contiguous(memory_format=torch.channels_last)
    assert workload.loss(model, (images, labels)).ndim == 0
    sums = workload.eval_sums(model, workload.prepare_batch(batch, train=False))
    assert int(sums["count"]) == 8 and int(sums["confusion"].sum()) == 8


def test_a_workload_must_define_the_required_methods() -> None:
    class Incomplete(Workload):
        pass

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()  # type: ignore[abstract]


def test_build_workload_picks_the_family_and_fills_the_hooks() -> None:
    cfg = config.load(DIGITS, ["workload.loader_workers=3", "workload.pin_memory=false"])
    workload = build_workload(cfg.workload, seed=0, precision=cfg.precision)
    assert isinstance(workload, CNNWorkload) and isinstance(cfg.workload, CNNWorkloadConfig)
    assert (workload.loader_workers, workload.pin_memory, workload.finish) == (3, False, None)

    cfg = config.load(SBI_DEBUG)
    workload = build_workload(cfg.workload, seed=0, precision=cfg.precision)
    assert isinstance(workload, SBIWorkload) and isinstance(cfg.workload, SBIWorkloadConfig)
    assert workload.finish is not None and workload.eval_batch_size == 16384
    assert workload.loader_workers == 0


def test_cifar10_missing_data_root(tmp_path: Path) -> None:
    cfg = config.load(CIFAR10, [f"workload.data_root={tmp_path / 'nothing-here'}"])
    with pytest.raises(RecipeError, match=r"workload\.data_root"):
        check_workload_data(cfg.workload)


DRIVER_STEPS = """
import sys
from trainforge import config
from trainforge.driver import launch, mlflow_run, recipe_change, run, warm_pool
from trainforge.driver.cluster import storage_root
from trainforge.driver.workers import base, failures, own
from trainforge.resources import find_recipe
from trainforge.tracking import driver as tracking
from trainforge.workloads import check_workload_data

cfg = config.load(find_recipe("cnn/digits_simple_cnn")[0], ["run.name=fresh"])
check_workload_data(cfg.workload)
root = storage_root(cfg.run)
launch.check_existing_run(cfg, root)
cfg = config.resolve(cfg, {"CPU": 2.0}, root)
recipe_change.check(cfg, root)
run.worker_payload(cfg, root)
tracking.driver_tags()
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""


def test_a_cnn_command_checks_its_recipe_without_importing_torch(tmp_path: Path) -> None:
    """Everything the driver does to a new CNN run before its workers (torch is theirs: ~1 s
    of every command's start-up on a 2-core machine)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", DRIVER_STEPS], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


SBI_DRIVER_STEPS = """
import sys
from trainforge import config
from trainforge.driver import launch, recipe_change
from trainforge.driver.cluster import storage_root
from trainforge.resources import find_recipe
from trainforge.workloads import check_workload_data, train_samples

overrides = ["run.name=fresh", f"workload.simulation.path={sys.argv[1]}",
             "workload.evaluation.observations_from=own"]
cfg = config.load(find_recipe("sbi/two_moons_parity")[0], overrides)
check_workload_data(cfg.workload)
root = storage_root(cfg.run)
launch.check_existing_run(cfg, root)
cfg = config.resolve(cfg, {"CPU": 2.0}, root)  # the simulation stage: finished simulations given
recipe_change.check(cfg, root)
assert train_samples(cfg.workload) == 1800, train_samples(cfg.workload)
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""


def test_an_sbi_command_checks_a_built_in_task_without_importing_torch(tmp_path: Path) -> None:
    """The same for an SBI recipe of a built-in task (its dimensions and cache fingerprint come
    from ``sbi/catalogue.py``): a CUDA build of torch takes seconds to import."""
    import json
    import subprocess
    import sys

    from trainforge.workloads.sbi import catalogue, simulations
    from trainforge.workloads.sbi.tasks import TASKS

    folder = tmp_path / "simulations"
    folder.mkdir()
    manifest = {"num_simulations": 2000, "invalid": 0, "dim_theta": 2, "dim_x": 2}
    (folder / simulations.MANIFEST).write_text(json.dumps(manifest))
    done = subprocess.run([sys.executable, "-c", SBI_DRIVER_STEPS, str(folder)], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"simulations ready: {folder}" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "[]"

    # the catalogue is the tasks' own facts
    assert list(catalogue.TASK_SHAPES) == list(TASKS)
    for name, make in TASKS.items():
        task, facts = make(), catalogue.builtin(name)
        assert (facts.dim_theta, facts.dim_x, facts.fingerprint) == (
            task.dim_theta,
            task.dim_x,
            task.fingerprint(),
        ), name
