"""GPU tier for sequential rounds: two NPE rounds on one GPU through the command, the second
round's θ drawn from the prior truncated to the first round's posterior, judged by the flow on
the GPU (the command's machine has one), and the last round's posterior loaded back as sbi's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import trainforge

pytestmark = [pytest.mark.gpu]


def test_two_npe_rounds_truncate_the_prior_on_the_gpu(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "trainforge", "train", "two_moons_debug", "run.name=seq-gpu",
         "workload.rounds=2", "workload.simulation.num_simulations=2000", "train.epochs=20",
         "scaling.num_workers=1", "scaling.use_gpu=true", "tracking.enabled=false",
         "workload.evaluation.sbc_runs=0", "workload.evaluation.pair_plot=false"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env={**os.environ, "TRAINFORGE_WORKERS": "own", "TRAINFORGE_HOME": str(tmp_path / "home")},
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert ("sequential: round r1: 2,000 θ from the prior truncated to round seq-gpu-r0's "
            "posterior at observation 1 (it keeps ") in out, out[-4000:]  # fmt: skip
    assert "of the prior; judged on the GPU)" in out, out[-4000:]
    run = tmp_path / "runs" / "seq-gpu"
    proposal = torch.load(run / "rounds" / "proposal-r1.pt", weights_only=True)
    assert proposal.device.type == "cpu" and proposal.shape == (2000, 2)
    assert bool((proposal.abs() <= 1).all())  # inside two_moons' prior box
    record = json.loads((run / "rounds.json").read_text())
    assert [r["name"] for r in record["rounds"]] == ["seq-gpu-r0", "seq-gpu-r1"]
    posterior = trainforge.load(run)
    samples = posterior.sample((100,), show_progress_bars=False)
    assert samples.shape == (100, 2) and bool(torch.isfinite(samples).all())
