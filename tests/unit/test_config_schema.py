"""trainforge.config.schema and rules: typed sections that check themselves, Literal choices
with a did-you-mean, the tri-state switches, and the rules across sections."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainforge import config
from trainforge.config.schema import (
    CheckpointSection,
    PrecisionSection,
    Recipe,
    RunSection,
    ScalingSection,
    TrackingSection,
    TrainSection,
    cuda_graph_blocker,
)
from trainforge.errors import RecipeError
from trainforge.workloads.cnn.config import CNNWorkloadConfig
from trainforge.workloads.sbi.config import EstimatorSection, SBIWorkloadConfig, SimulationSection

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "recipes" / "cnn" / "digits_simple_cnn.yaml"
SBI_DEBUG = REPO / "recipes" / "sbi" / "two_moons_debug.yaml"
CIFAR = REPO / "recipes" / "cnn" / "cifar10_resnet18.yaml"


def test_load_returns_dataclasses_all_the_way_down() -> None:
    cfg = config.load(SBI_DEBUG)
    assert type(cfg) is Recipe
    assert type(cfg.train) is TrainSection and type(cfg.scaling) is ScalingSection
    assert type(cfg.workload) is SBIWorkloadConfig
    assert type(cfg.workload.simulation) is SimulationSection
    assert isinstance(cfg.workload.evaluation.observations, list)
    assert type(config.load(DIGITS).workload) is CNNWorkloadConfig


def test_from_container_returns_the_same_typed_recipe() -> None:
    cfg = config.load(SBI_DEBUG, ["train.lr=0.002"])
    again = config.from_container(config.to_container(cfg))
    assert again == cfg and type(again.workload) is SBIWorkloadConfig


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: TrainSection(lr=-1.0), "train.lr: must be > 0, got -1.0"),
        (lambda: TrainSection(max_steps=0), "train.max_steps: must be >= 1 (or null), got 0"),
        (lambda: TrainSection(min_lr_ratio=2.0), "train.min_lr_ratio: must be in [0, 1], got 2.0"),
        (lambda: RunSection(name="a/b"), "run.name: must be a non-empty name without '/'"),
        (lambda: ScalingSection(num_workers=0), "scaling.num_workers: must be >= 1, got 0"),
        (lambda: CheckpointSection(keep_last=0), "checkpoint.keep_last: must be >= 1, got 0"),
        (lambda: TrackingSection(profile_steps=-1), "tracking.profile_steps: must be >= 0"),
        (lambda: PrecisionSection(dtype="fp8"), "precision.dtype: 'fp8' is not one of"),  # type: ignore[arg-type]
        (lambda: CNNWorkloadConfig(val_fraction=1.0), "workload.val_fraction: must be in (0, 1)"),
        (lambda: SimulationSection(chunk_size=0), "workload.simulation.chunk_size: must be >= 1"),
        (lambda: EstimatorSection(num_bins=0), "workload.estimator.num_bins: must be >= 1"),
    ],
)
def test_sections_built_in_code_check_themselves(build, message: str) -> None:
    with pytest.raises(RecipeError, match="^" + re.escape(message)):
        build()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("precision.dtype=bf61", "precision.dtype: 'bf61' is not one of fp32, bf16, fp16 "
         "(did you mean 'bf16'?)"),
        ("train.optimizer=adamm", "train.optimizer: 'adamm' is not one of adamw, adam, sgd "
         "(did you mean 'adam'?)"),
        ("scaling.placement_strategy=SPREAD_", "(did you mean 'SPREAD'?)"),
        ("workload.data_on_device=some", "data_on_device: 'some' is not one of auto, true"),
        ("workload.synthetic_train_size=0", "workload.synthetic_train_size: must be >= 1, got 0"),
    ],
)  # fmt: skip
def test_bad_choices_name_the_key_and_suggest(override: str, message: str) -> None:
    with pytest.raises(RecipeError) as info:
        config.load(DIGITS, [override])
    assert message in str(info.value)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize(
    ("override", "expected"),
    [("scaling.use_gpu=true", "true"), ("scaling.use_gpu=false", "false"),
     ("scaling.use_gpu=auto", "auto"), ("workload.data_on_device=true", "true")],
)  # fmt: skip
def test_switches_accept_command_line_bools(override: str, expected: str) -> None:
    cfg = config.load(DIGITS, [override])
    key = override.split("=")[0].split(".")
    section = cfg.scaling if key[0] == "scaling" else cfg.workload
    assert getattr(section, key[1]) == expected


def test_sbi_switches_accept_yaml_bools(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(
        "run:\n  name: x\nworkload:\n  kind: sbi\n  data_on_device: true\n"
        "  stream_from_disk: false\n"
    )
    cfg = config.load(recipe)
    assert isinstance(cfg.workload, SBIWorkloadConfig)
    assert (cfg.workload.data_on_device, cfg.workload.stream_from_disk) == ("true", "false")


def test_cuda_graphs_against_cpu_workers_is_refused_when_loading() -> None:
    with pytest.raises(RecipeError, match=r"precision\.cuda_graphs: needs GPU workers"):
        config.load(SBI_DEBUG, ["precision.cuda_graphs=true", "scaling.use_gpu=false"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [(["train.grad_accum_steps=2"], "needs train.grad_accum_steps=1"),
     (["precision.dtype=fp16"], "needs bf16 or fp32 (fp16's loss scaling is not captured)"),
     (["precision.compile=true"], "needs precision.compile=false")],
)  # fmt: skip
def test_cuda_graphs_true_refuses_what_auto_leaves_to_eager_steps(
    overrides: list[str], message: str
) -> None:
    """``true`` is a demand: a step that cannot be captured is refused in one line. ``auto``
    loads the same recipe (the worker takes eager steps and says why)."""
    with pytest.raises(RecipeError) as info:
        config.load(CIFAR, ["precision.cuda_graphs=true", *overrides])
    assert str(info.value) == f"precision.cuda_graphs: {message}"
    cfg = config.load(CIFAR, ["precision.cuda_graphs=auto", *overrides])
    assert cuda_graph_blocker(cfg) == message


def test_cuda_graphs_take_every_optimizer_and_yaml_bools(tmp_path: Path) -> None:
    for optimizer in ("sgd", "adam", "adamw"):
        cfg = config.load(CIFAR, ["precision.cuda_graphs=true", f"train.optimizer={optimizer}"])
        assert cfg.precision.cuda_graphs == "true" and cuda_graph_blocker(cfg) is None
    assert config.load(CIFAR).precision.cuda_graphs == "auto"  # the shipped recipe's choice
    assert config.load(DIGITS).precision.cuda_graphs == "false"  # the schema's default
    recipe = tmp_path / "r.yaml"
    recipe.write_text("run:\n  name: x\nprecision:\n  cuda_graphs: true\nworkload:\n  kind: cnn\n")
    assert config.load(recipe).precision.cuda_graphs == "true"


def test_a_gpu_per_worker_without_gpus_is_refused() -> None:
    with pytest.raises(RecipeError, match=r"scaling\.resources_per_worker\.GPU: set, but"):
        config.load(DIGITS, ["scaling.use_gpu=false", "scaling.resources_per_worker.GPU=1"])


def test_a_cnn_recipe_loads_without_importing_sbi() -> None:
    code = (
        "import sys; from trainforge import config; "
        f"config.load({str(DIGITS)!r}); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'sbi' "
        "or m.startswith('trainforge.workloads.sbi')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_epochs_null_trains_until_early_stopping_and_needs_it() -> None:
    """train.epochs: null is the SBI recipes' "until early stopping"; without early stopping
    (or max_steps) it would never end, and a decay schedule has no length to decay over."""
    stopping = ["train.epochs=null", "train.early_stopping_patience=5"]
    cfg = config.load(DIGITS, [*stopping, "train.schedule=plateau", "train.plateau_patience=2"])
    assert cfg.train.epochs is None
    with pytest.raises(RecipeError, match=r"^train\.epochs: null trains until early stopping"):
        config.load(DIGITS, ["train.epochs=null", "train.schedule=constant"])
    with pytest.raises(RecipeError, match=r"^train\.schedule=cosine: decays over the run's len"):
        config.load(DIGITS, [*stopping, "train.schedule=cosine"])
    assert config.load(DIGITS, [*stopping, "train.max_steps=30"]).train.max_steps == 30
