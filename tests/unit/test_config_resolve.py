"""trainforge.config.resolve: what the driver decides once it knows the cluster (worker count,
device, the workload's data), written into a new recipe, never into the one it was given."""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import pytest

from trainforge import config
from trainforge.config.resolve import resolve_scaling, worker_resources
from trainforge.config.schema import ScalingSection
from trainforge.errors import RecipeError
from trainforge.workloads.sbi import simulations
from trainforge.workloads.sbi.config import SBIWorkloadConfig

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "recipes" / "cnn" / "digits_simple_cnn.yaml"
SBI_DEBUG = REPO / "recipes" / "sbi" / "two_moons_debug.yaml"


def _scaling(*overrides: str) -> ScalingSection:
    """A real, validated scaling section (types as the loader makes them)."""
    return config.load(DIGITS, list(overrides)).scaling


# --- resolve_scaling: can the cluster host the workers? -------------------------------------


def test_use_gpu_true_without_gpu() -> None:
    with pytest.raises(RecipeError, match=r"scaling\.use_gpu"):
        resolve_scaling(_scaling("scaling.use_gpu=true"), {"CPU": 2})


def test_too_few_gpus_for_the_workers() -> None:
    scaling = _scaling("scaling.use_gpu=true", "scaling.num_workers=2")
    with pytest.raises(RecipeError, match=r"scaling\.num_workers.*GPU"):
        resolve_scaling(scaling, {"CPU": 8, "GPU": 1})


def test_too_few_cpus_for_the_workers() -> None:
    scaling = _scaling("scaling.use_gpu=false", "scaling.num_workers=4")
    with pytest.raises(RecipeError, match=r"scaling\.num_workers.*CPU"):
        resolve_scaling(scaling, {"CPU": 2})


def test_resources_per_worker_are_multiplied_by_workers() -> None:
    scaling = _scaling("scaling.num_workers=2", "scaling.resources_per_worker.CPU=3")
    with pytest.raises(RecipeError, match=r"need 6 CPU.*has 5"):
        resolve_scaling(scaling, {"CPU": 5})
    assert resolve_scaling(scaling, {"CPU": 6}).use_gpu == "false"


def test_auto_uses_gpus_when_there_are_some() -> None:
    scaling = _scaling("scaling.use_gpu=auto", "scaling.num_workers=2")
    assert resolve_scaling(scaling, {"CPU": 8, "GPU": 2}).use_gpu == "true"
    assert worker_resources(scaling, True) == {"CPU": 1, "GPU": 1}
    assert resolve_scaling(scaling, {"CPU": 8}).use_gpu == "false"
    assert worker_resources(scaling, False) == {"CPU": 1}
    assert scaling.use_gpu == "auto"  # the section given is left as it was


def test_use_all_gpus_sets_num_workers() -> None:
    scaling = _scaling("scaling.use_all_gpus=true", "scaling.num_workers=1")
    resolved = resolve_scaling(scaling, {"CPU": 8, "GPU": 4})
    assert (resolved.num_workers, resolved.use_gpu) == (4, "true")
    assert scaling.num_workers == 1  # a new section; the recipe's is untouched


def test_use_all_gpus_without_gpus() -> None:
    scaling = _scaling("scaling.use_all_gpus=true")
    with pytest.raises(RecipeError, match=r"scaling\.use_all_gpus"):
        resolve_scaling(scaling, {"CPU": 8})


def test_use_all_gpus_with_too_few_gpus_per_worker() -> None:
    scaling = _scaling("scaling.use_all_gpus=true", "scaling.resources_per_worker.GPU=2")
    with pytest.raises(RecipeError, match=r"scaling\."):
        resolve_scaling(scaling, {"CPU": 8, "GPU": 1})


def test_use_all_gpus_with_zero_gpus_per_worker() -> None:
    scaling = _scaling("scaling.use_all_gpus=true", "scaling.resources_per_worker.GPU=0")
    with pytest.raises(RecipeError, match=r"scaling\."):
        resolve_scaling(scaling, {"CPU": 8, "GPU": 4})


def test_cuda_graphs_need_gpu_workers() -> None:
    # (with scaling.use_gpu=false the recipe is refused when loaded: test_config_schema)
    cfg = config.load(SBI_DEBUG, ["precision.cuda_graphs=true", "scaling.use_gpu=auto"])
    with pytest.raises(RecipeError, match="cuda_graphs: needs GPU workers"):
        resolve_scaling(cfg.scaling, {"CPU": 8}, cfg.precision.cuda_graphs == "true")
    two_gpus = dataclasses.replace(cfg.scaling, num_workers=2, use_gpu="true")  # DDP captured too
    assert resolve_scaling(two_gpus, {"CPU": 8, "GPU": 2}, True).use_gpu == "true"


# --- resolve: the whole recipe ----------------------------------------------------------------


def test_resolve_returns_a_new_recipe_and_keeps_the_given_one(tmp_path: Path) -> None:
    cfg = config.load(DIGITS, ["scaling.use_all_gpus=true", "scaling.num_workers=1"])
    before = config.to_yaml(cfg)
    resolved = config.resolve(cfg, {"CPU": 16, "GPU": 8}, str(tmp_path))
    assert (resolved.scaling.num_workers, resolved.scaling.use_gpu) == (8, "true")
    assert config.to_yaml(cfg) == before
    # what workers receive and checkpoints store is the resolved recipe
    again = config.from_container(config.to_container(resolved))
    assert again == resolved
    assert "use_gpu: 'true'" in config.to_yaml(resolved)


def test_resolve_checks_the_cluster(tmp_path: Path) -> None:
    cfg = config.load(DIGITS, ["scaling.use_gpu=true"])
    with pytest.raises(
        RecipeError, match=r"scaling\.use_gpu: true, but the Ray cluster has no GPU"
    ):
        config.resolve(cfg, {"CPU": 4}, str(tmp_path))
    # a command whose workers are processes of its own names the machine, not a Ray cluster
    two = config.load(DIGITS, ["scaling.use_gpu=true", "scaling.num_workers=2"])
    with pytest.raises(RecipeError, match=r"2 workers × 1 GPU need 2 GPU, but this machine has 1$"):
        config.resolve_workers(two, {"CPU": 16, "GPU": 1}, "this machine")


def test_a_batch_larger_than_the_shard_of_every_gpu_is_refused(tmp_path: Path) -> None:
    """With use_all_gpus the worker count, hence the shard, is known only here."""
    cfg = config.load(DIGITS, ["scaling.use_all_gpus=true", "train.batch_size=64"])
    with pytest.raises(RecipeError) as caught:
        config.resolve(cfg, {"CPU": 64, "GPU": 64}, str(tmp_path))
    assert str(caught.value) == (
        "train.batch_size: 64 is more than a worker's shard of 23 samples (1437 training samples "
        "over 64 workers); lower train.batch_size or scaling.num_workers, or use more data"
    )
    assert config.resolve(cfg, {"CPU": 64, "GPU": 22}, str(tmp_path)).scaling.num_workers == 22


def test_the_shard_of_finished_simulations_counts_the_dropped_rows(tmp_path: Path) -> None:
    """Finished simulations decide the training rows: 1000, less 600 invalid ones dropped,
    less sbi's validation tenth (40) leave 360, 180 a worker."""
    folder = _finished_simulations(tmp_path / "sims", num=1000, invalid=600)
    given = ["scaling.num_workers=2", f"workload.simulation.path={folder}"]
    assert config.load(SBI_DEBUG, [*given, "train.batch_size=400"]).train.batch_size == 400
    with pytest.raises(RecipeError, match=r"shard of 180 samples \(360 training samples"):
        config.load(SBI_DEBUG, [*given, "train.batch_size=200",
                                "workload.simulation.drop_invalid=true"])  # fmt: skip


def _finished_simulations(folder: Path, num: int = 20, invalid: int = 0) -> Path:
    """A folder that says it holds finished simulations (all the resolve step reads)."""
    folder.mkdir(parents=True)
    manifest = {"num_simulations": num, "invalid": invalid, "dim_theta": 2, "dim_x": 2}
    (folder / simulations.MANIFEST).write_text(json.dumps(manifest))
    return folder


USER_MODULE = """
import torch

def prior():
    return torch.distributions.Independent(
        torch.distributions.Uniform(-torch.ones(2), torch.ones(2)), 1
    )

def simulate(theta):
    return theta + 0.1 * torch.randn_like(theta)
"""


def test_sbi_code_dir_and_simulation_path_are_resolved(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = f"resolve_sim_{tmp_path.name.replace('-', '_')}"
    code = tmp_path / "code"
    code.mkdir()
    (code / f"{name}.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(code))
    folder = _finished_simulations(tmp_path / "sims")
    overrides = ["workload.task=custom", f"workload.prior={name}:prior",
                 f"workload.simulator={name}:simulate", "workload.evaluation.observations=[]",
                 f"workload.simulation.path={folder}", "train.batch_size=8"]  # fmt: skip
    cfg = config.load(SBI_DEBUG, overrides)
    assert isinstance(cfg.workload, SBIWorkloadConfig) and cfg.workload.code_dir is None
    try:
        resolved = config.resolve(cfg, {"CPU": 4}, str(tmp_path / "runs"))
    finally:
        sys.modules.pop(name, None)
    assert isinstance(resolved.workload, SBIWorkloadConfig)
    assert resolved.workload.code_dir == str(code.resolve())
    assert resolved.workload.simulation.path == str(folder)
    assert resolved.scaling.use_gpu == "false"
    assert cfg.workload.code_dir is None  # the loaded recipe is unchanged
