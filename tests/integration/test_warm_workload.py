"""Warm workers (``driver/warm_pool.py``, ``worker/warm.py``) and a user's own workload module:
trained on the lasting local cluster's warm workers, then edited, the module is never run from
the first run's import; the next run's workers are replaced, saying why, and train the edited
model. Real ``trainforge train`` commands in a home of their own (its own lasting cluster), on a
copy of ``examples/wave`` outside the repository, as a user runs them."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.integration.test_local_cluster import run
from trainforge import checkpoint

pytestmark = pytest.mark.ray

WAVE = Path(__file__).resolve().parents[2] / "examples" / "wave"
MIDDLE_LAYER = "            nn.Linear(c.hidden, c.hidden), nn.GELU(),\n"
"""The wave model's middle layer, as ``wave_task.py`` writes it: the user's edit removes it."""
SHORT = ["train.epochs=1", "workload.config.train_size=256", "tracking.enabled=false"]


def trained(home: Path, project: Path, name: str) -> tuple[str, dict[str, torch.Size]]:
    """What the run ``name`` of the project's recipe said, and its final model's shapes."""
    done = run(home, "train", "recipe.yaml", f"run.name={name}", *SHORT, cwd=project,
               TRAINFORGE_WORKERS="warm")  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    final = checkpoint.newest_in(project / "runs" / name).state
    assert final is not None
    return said, {key: value.shape for key, value in final["model"].items()}


def test_an_edited_workload_module_is_never_run_from_a_warm_workers_old_import(
    home: Path, tmp_path: Path
) -> None:
    project = tmp_path / "wave"
    shutil.copytree(WAVE, project)

    said, before = trained(home, project, "before")
    assert "workers: starting 2 (they stay warm for later runs)" in said, said
    assert sorted(before) == [f"{layer}.{p}" for layer in (0, 2, 4) for p in ("bias", "weight")]

    module = project / "wave_task.py"
    source = module.read_text()
    assert MIDDLE_LAYER in source
    module.write_text(source.replace(MIDDLE_LAYER, ""))
    said, after = trained(home, project, "after")
    assert "workers: replacing 2 warm workers (module wave_task changed on disk)" in said, said
    # the edited model: the input layer straight into the output layer
    assert after == {"0.weight": (64, 8), "0.bias": (64,), "2.weight": (1, 64), "2.bias": (1,)}
