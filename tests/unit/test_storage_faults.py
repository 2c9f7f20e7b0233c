"""Storage that cannot be written and data that is not there, met by whole commands: one line
naming the path and the problem, exit 2, before Ray is even asked for (so before any worker),
and nothing written. (A disk that fills up mid-run: tests/integration/test_disk_full.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import RECIPES
from trainforge import cli
from trainforge.driver import launch

DIGITS = RECIPES / "cnn" / "digits_simple_cnn.yaml"
SBI = RECIPES / "sbi" / "two_moons_debug.yaml"


@pytest.fixture(autouse=True)
def no_ray(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every command here must stop before it connects to Ray (another test may have started
    one in this process: a stub that fails is the check)."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the refused command connected to Ray")

    monkeypatch.setattr(launch, "connect", refuse)
    monkeypatch.chdir(tmp_path)


def refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


@pytest.mark.parametrize("command", ["train", "simulate"])
def test_a_storage_path_under_a_file_is_refused_before_ray(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "notes.txt"
    blocker.write_text("a file, where a folder was meant")
    line = refused([command, str(SBI), "run.name=r", f"run.storage_path={blocker}/runs"], capsys)
    assert line == (
        f"trainforge: error: run.storage_path: cannot write in {blocker}/runs: {blocker} is a "
        "file, not a folder"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # no mlflow.db, no lock


def test_an_unwritable_storage_path_is_refused_before_ray(
    capsys: pytest.CaptureFixture[str],
) -> None:
    line = refused(["train", str(DIGITS), "run.storage_path=/sys"], capsys)
    assert line == "trainforge: error: run.storage_path: cannot write in /sys: Permission denied"


def test_a_missing_image_folder_is_refused_before_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    absent = tmp_path / "images"
    line = refused(["train", str(DIGITS), "workload.dataset=imagefolder",
                    f"workload.data_root={absent}", "run.name=r"], capsys)  # fmt: skip
    assert line == (
        f"trainforge: error: workload.data_root='{absent}': folder {absent} does not exist"
    )
    assert not (tmp_path / "runs" / "r").exists() and not (tmp_path / "runs" / ".r.lock").exists()


def test_a_missing_simulation_folder_is_refused_before_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    absent = tmp_path / "sims"
    line = refused(["train", str(SBI), f"workload.simulation.path={absent}"], capsys)
    assert line == f"trainforge: error: workload.simulation.path: folder {absent} does not exist"
