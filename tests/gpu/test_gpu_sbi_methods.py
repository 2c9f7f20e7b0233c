"""GPU tier for the SBI methods beyond NPE: each method's debug recipe through the command on
one GPU, its steps captured as one CUDA graph (their random draws — NRE's atoms, the vector
fields' times and noise — from the device's generator, which graph replays advance), its
posterior exported and loaded back as sbi's."""

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


@pytest.mark.parametrize("method", ["nle", "nre", "fmpe", "npse"])
def test_a_method_trains_on_one_gpu_with_its_steps_captured(method: str, tmp_path: Path) -> None:
    name, recipe = f"{method}-gpu", RECIPES / f"two_moons_{method}_debug.yaml"
    done = subprocess.run(
        [sys.executable, "-m", "trainforge", "train", str(recipe),
         f"run.name={name}", "scaling.num_workers=1", "scaling.use_gpu=true",
         "precision.cuda_graphs=true", "tracking.enabled=false"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "TRAINFORGE_WORKERS": "own", "TRAINFORGE_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "on GPU" in out, out[-4000:]  # the worker's line: started on GPU 0
    assert CAPTURE_FAILED not in out, out[-4000:]
    metrics = json.loads((tmp_path / "runs" / name / "finished.json").read_text())["metrics"]
    assert math.isfinite(metrics["val/loss"])
    assert 0.5 <= metrics["c2st/mean"] < 0.9, metrics  # chance 0.5; an untrained one near 1
    posterior = trainforge.load(str(tmp_path / "runs" / name))
    _, x_obs = get_task("two_moons").observation(1)
    samples = posterior.sample((50,), x=x_obs, show_progress_bars=False)
    assert samples.shape == (50, 2) and bool(((samples >= -1) & (samples <= 1)).all())
