"""GPU tier for the SBI methods beyond NPE: each method's debug recipe through the command on
one GPU, its posterior exported and loaded back as sbi's. NLE's and NRE's steps are captured as
one CUDA graph (NRE's atoms drawn by the device's generator, which graph replays advance);
FMPE's and NPSE's cannot be (sbi's loss reads a flag tensor on the host): ``auto`` tries, says
so and goes on eager, and ``true`` is refused at recipe load (tests/unit/test_sbi_config.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

import trainforge
from trainforge.workloads.sbi.tasks import get_task

pytestmark = [pytest.mark.gpu]

RECIPES = Path(__file__).resolve().parents[2] / "recipes" / "sbi"
CAPTURE_FAILED = "CUDA graph capture failed"  # worker/step.py's line when a step falls back


@pytest.mark.parametrize(
    ("method", "graphs"), [("nle", "true"), ("nre", "true"), ("fmpe", "auto"), ("npse", "auto")]
)
def test_a_method_trains_on_one_gpu(method: str, graphs: str, tmp_path: Path) -> None:
    name, recipe = f"{method}-gpu", RECIPES / f"two_moons_{method}_debug.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "trainforge", "train", str(recipe),
         f"run.name={name}", "scaling.num_workers=1", "scaling.use_gpu=true",
         f"precision.cuda_graphs={graphs}", "tracking.enabled=false"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "TRAINFORGE_WORKERS": "own", "TRAINFORGE_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "on GPU" in out, out[-4000:]  # the worker's line: started on GPU 0
    assert (CAPTURE_FAILED in out) == (graphs == "auto"), out[-4000:]
    metrics = json.loads((tmp_path / "runs" / name / "finished.json").read_text())["metrics"]
    assert math.isfinite(metrics["val/loss"])
    assert 0.5 <= metrics["c2st/mean"] < 0.9, metrics  # chance 0.5; an untrained one near 1
    posterior = trainforge.load(str(tmp_path / "runs" / name))
    _, x_obs = get_task("two_moons").observation(1)
    samples = posterior.sample((50,), x=x_obs, show_progress_bars=False)
    assert samples.shape == (50, 2) and bool(((samples >= -1) & (samples <= 1)).all())
