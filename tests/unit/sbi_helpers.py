"""Shared by the SBI unit tests: simulations drawn from a built-in task's prior and simulator,
in memory or as a finished cache entry, and the debug recipe."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from trainforge import config
from trainforge.errors import RecipeError
from trainforge.workloads.sbi import simulations
from trainforge.workloads.sbi.tasks import get_task


def _data(n: int = 2000, task: str = "two_moons") -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    t = get_task(task)
    theta = t.prior_sample(n, generator)
    return theta, t.simulate(theta, generator)


ROOT = Path(__file__).resolve().parents[2]
DEBUG = ROOT / "recipes" / "sbi" / "two_moons_debug.yaml"


def write_simulations(folder: Path, n: int, chunk_size: int, nan_rows: int = 0) -> Path:
    """A finished cache entry in the simulation stage's layout, some x rows NaN if asked."""
    generator = torch.Generator().manual_seed(0)
    task = get_task("two_moons")
    theta = task.prior_sample(n, generator)
    x = task.simulate(theta, generator)
    x[torch.randperm(n, generator=generator)[:nan_rows], 1] = float("nan")
    folder.mkdir(parents=True)
    for i, start in enumerate(range(0, n, chunk_size)):
        part = slice(start, start + chunk_size)
        invalid = int((~torch.isfinite(x[part]).all(dim=1)).sum())
        chunk = {"theta": theta[part].clone(), "x": x[part].clone(), "invalid": invalid}
        torch.save(chunk, simulations.chunk_file(folder, i))
    manifest = {
        "num_simulations": n, "chunk_size": chunk_size, "chunks": -(-n // chunk_size),
        "invalid": nan_rows, "dim_theta": 2, "dim_x": 2,
    }  # fmt: skip
    simulations.write_json(folder / simulations.MANIFEST, manifest)
    return folder


def assert_refused_before_launch(
    recipe: Path, overrides: list[str], message: str, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:  # fmt: skip
    """``recipe`` with ``overrides`` fails to load with ``message``, and `trainforge train`
    says so in one line and exits 2 without dispatching a run."""
    from trainforge import cli
    from trainforge.driver import launch

    def must_not_run(*args: object) -> None:
        raise AssertionError("dispatched a refused recipe")

    with pytest.raises(RecipeError, match=re.escape(message)):
        config.load(recipe, overrides)
    monkeypatch.setattr(launch, "train", must_not_run)
    assert cli.main(["train", str(recipe), *overrides]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"trainforge: error: {message[:30]}") and err.count("\n") == 1, err
