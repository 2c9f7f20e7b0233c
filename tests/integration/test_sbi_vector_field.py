"""``workload.method: fmpe | npse`` end to end: `trainforge train` on each vector-field debug
recipe (2 workers), its val/loss falls, C2ST through sbi's VectorFieldPosterior scores it far
from an untrained posterior's ~1.0, SBC runs for fmpe and is skipped for npse, and the run
loads as sbi's VectorFieldPosterior that samples inside the prior."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from mlflow.tracking import MlflowClient

import trainforge
from trainforge.cli import main as cli_main
from trainforge.tracking.client import resolve_uri
from trainforge.workloads.sbi import load_posterior
from trainforge.workloads.sbi.tasks import get_task

pytestmark = [pytest.mark.ray, pytest.mark.slow]

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "sbi"


@pytest.mark.parametrize(
    ("method", "fall", "sampler"),
    [
        ("fmpe", 0.15, "ode"),  # measured: 0.52 after epoch 1, best 0.25
        ("npse", 3.0, "sde"),  # measured: 32.6 after epoch 1, best 26.8
    ],
)
def test_a_vector_field_method_learns_and_exports_sbis_vector_field_posterior(
    method: str, fall: float, sampler: str, ray_cluster, in_tmp: Path
) -> None:
    from sbi.inference import VectorFieldPosterior

    name = f"{method}-2w"
    recipe = RECIPES / f"two_moons_{method}_debug.yaml"
    assert cli_main(["train", str(recipe), f"run.name={name}"]) == 0
    client = MlflowClient(tracking_uri=resolve_uri(None))
    experiment = client.get_experiment_by_name("trainforge").experiment_id
    (run,) = client.search_runs([experiment], f"tags.`trainforge.run_name` = '{name}'")
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "val/loss")
    losses = [m.value for m in sorted(history, key=lambda m: m.step)]
    assert min(losses) < losses[0] - fall, losses
    c2st = run.data.metrics["c2st/obs1"]
    assert np.isfinite(c2st) and c2st < 0.85, c2st  # measured 0.73 for each; untrained ~1.0
    calibrated = {"sbc/ks_pvalue_min", "tarp/atc"} <= run.data.metrics.keys()
    assert calibrated == (method == "fmpe"), run.data.metrics  # npse skips SBC and TARP

    posterior = trainforge.load(in_tmp / "runs" / name)
    assert isinstance(posterior, VectorFieldPosterior) and posterior.sample_with == sampler
    exported = load_posterior(in_tmp / "runs" / name / "posterior.pt")
    assert isinstance(exported, VectorFieldPosterior)
    _, x_obs = get_task("two_moons").observation(1)
    samples = posterior.sample((200,), x=x_obs, show_progress_bars=False)
    assert samples.shape == (200, 2) and bool(samples.abs().le(1).all())  # the prior's box
    files = {a.path for a in client.list_artifacts(run.info.run_id, "evaluation")}
    assert {"evaluation/posterior.pt", "evaluation/pair_plot_obs1.png"} <= files
