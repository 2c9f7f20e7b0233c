"""The rehearsal's recipe (``driver/rehearsal.py``): the command's recipe cut to a few logged
steps in a folder of its own, with its own MLflow store and the workload's cheapest final
evaluation. The rehearsal itself runs in the background after a cold command: its whole path
is in tests/integration/test_local_cluster.py."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import RECIPES
from trainforge import config
from trainforge.driver import rehearsal


def test_a_rehearsal_is_the_recipe_cut_short_in_its_own_folder(tmp_path: Path) -> None:
    cfg = config.load(RECIPES / "cnn" / "digits_simple_cnn.yaml",
                      ["run.name=mine", "run.max_failures=3", "scaling.num_workers=2"])  # fmt: skip
    short = rehearsal.recipe(cfg, tmp_path)

    assert (short.run.name, short.run.storage_path, short.run.max_failures) == (
        "rehearsal", str(tmp_path), 0)  # fmt: skip
    assert short.checkpoint.resume is False
    assert (short.train.max_steps, short.train.log_every_steps) == (rehearsal.STEPS, 1)
    assert short.tracking.tracking_uri == f"sqlite:///{tmp_path}/mlflow.db"
    # what the workers run is the command's: model, batch, workers, precision, data
    assert short.workload == cfg.workload
    assert short.scaling == cfg.scaling and short.precision == cfg.precision
    assert short.train.batch_size == cfg.train.batch_size
    assert cfg.run.name == "mine" and cfg.train.max_steps is None  # the command's is untouched


def test_an_sbi_rehearsal_samples_its_posterior_without_scoring_it(tmp_path: Path) -> None:
    cfg = config.load(RECIPES / "sbi" / "two_moons_debug.yaml",
                      ["workload.evaluation.observations=[1,2]"])  # fmt: skip
    evaluation = rehearsal.recipe(cfg, tmp_path).workload.evaluation  # type: ignore[attr-defined]

    assert (evaluation.c2st, evaluation.sbc_runs, evaluation.num_samples) == (False, 0, 100)
    assert evaluation.observations == [1, 2] and evaluation.pair_plot is True  # as it was
    assert cfg.workload.evaluation.sbc_runs != 0  # type: ignore[attr-defined]


def test_a_rehearsal_that_may_graph_its_steps_captures_and_replays(tmp_path: Path) -> None:
    """The graphed step's eager steps before capture are real steps now: a rehearsal of a
    GPU recipe takes them too, then the capture and a replay (``worker.step``'s counts)."""
    from trainforge.worker.step import DDP_WARMUP_STEPS, WARMUP_STEPS

    assert rehearsal.GRAPH_WARMUP_STEPS == (WARMUP_STEPS, DDP_WARMUP_STEPS)
    resnet = RECIPES / "cnn" / "synthetic_resnet18_bench.yaml"

    def steps(*overrides: str) -> int:
        cfg = config.load(resnet, ["scaling.use_gpu=true", *overrides])
        return rehearsal.recipe(cfg, tmp_path).train.max_steps  # type: ignore[return-value]

    assert steps("scaling.num_workers=1") == 2 + WARMUP_STEPS
    assert steps("scaling.num_workers=4") == 2 + DDP_WARMUP_STEPS
    assert steps("scaling.num_workers=4", "precision.cuda_graphs=false") == 2
    assert steps("scaling.num_workers=1", "train.grad_accum_steps=2") == 2  # eager: no capture
    cpu = config.load(RECIPES / "cnn" / "digits_simple_cnn.yaml", ["scaling.use_gpu=false"])
    assert rehearsal.recipe(cpu, tmp_path).train.max_steps == rehearsal.STEPS
