"""Checkpoint files and where they go (``trainforge.checkpoint``): weights_only loading, the
manifest and its verification, the newest valid checkpoint on disk (broken ones — truncated,
bit-flipped, without a manifest — skipped), the latest of the reporter's and the disk's, the
local reporter."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from trainforge import checkpoint
from trainforge.checkpoint import FolderReporter, Unverified
from trainforge.errors import NoValidCheckpoint, RecipeError


def state(global_step: int) -> dict[str, Any]:
    return {"model": {"w": torch.full((2,), float(global_step))}, "global_step": global_step}


def write(folder: Path, global_step: int) -> Path:
    folder.mkdir(parents=True)
    checkpoint.save(folder, state(global_step), "run:\n  name: x\n")
    return folder


def truncate(folder: Path) -> None:
    path = folder / checkpoint.STATE_FILE
    path.write_bytes(path.read_bytes()[:-100])


def flip_a_byte(folder: Path) -> None:
    path = folder / checkpoint.STATE_FILE
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def remove_manifest(folder: Path) -> None:
    (folder / checkpoint.MANIFEST_FILE).unlink()


CORRUPTIONS = {
    "truncated": (truncate, r"bytes where the manifest says \d+ \(truncated\?\)"),
    "bit-flipped": (flip_a_byte, r"sha256 differs from the manifest"),
    "manifest missing": (remove_manifest, r"no manifest\.json"),
}


class Registered:
    """A reporter whose backend hands back a given checkpoint state (or the checkpoint in a
    folder, verified as Ray's is)."""

    def __init__(self, registered: dict[str, Any] | Path | None) -> None:
        self.state = registered

    def report(self, metrics: dict[str, float], folder: Path | None) -> None:
        raise AssertionError("not reported to")

    def registered(self) -> dict[str, Any] | None:
        return checkpoint.load(self.state) if isinstance(self.state, Path) else self.state


def test_save_and_load_with_weights_only(tmp_path: Path) -> None:
    write(tmp_path / "c", 7)
    loaded = torch.load(tmp_path / "c" / checkpoint.STATE_FILE, weights_only=True)
    assert loaded["global_step"] == 7
    assert torch.equal(checkpoint.load(tmp_path / "c")["model"]["w"], torch.full((2,), 7.0))
    assert (tmp_path / "c" / checkpoint.RECIPE_FILE).read_text() == "run:\n  name: x\n"


def test_the_manifest_lists_every_file_and_is_written_last(tmp_path: Path) -> None:
    folder = write(tmp_path / "c", 7)
    manifest = json.loads((folder / checkpoint.MANIFEST_FILE).read_text())
    assert manifest["global_step"] == 7
    assert set(manifest["files"]) == {checkpoint.STATE_FILE, checkpoint.RECIPE_FILE}
    for name, entry in manifest["files"].items():
        assert entry["size"] == (folder / name).stat().st_size
        assert len(entry["sha256"]) == 64
    assert checkpoint.verify(folder) == manifest
    assert sorted(p.name for p in folder.iterdir()) == sorted(
        [*manifest["files"], checkpoint.MANIFEST_FILE]  # no temporary files left behind
    )
    # never written in place: a second save into a sealed folder is refused, files untouched
    before = (folder / checkpoint.STATE_FILE).read_bytes()
    with pytest.raises(FileExistsError, match="never written in place"):
        checkpoint.save(folder, state(8), "")
    assert (folder / checkpoint.STATE_FILE).read_bytes() == before
    # a save that fails part-way leaves no manifest, so the half-written folder never verifies
    half = tmp_path / "half"
    half.mkdir()
    with pytest.raises(TypeError):
        checkpoint.save(half, state(9), None)  # type: ignore[arg-type]
    assert (half / checkpoint.STATE_FILE).exists()
    assert not (half / checkpoint.MANIFEST_FILE).exists()
    with pytest.raises(Unverified, match="no manifest"):
        checkpoint.load(half)


@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_a_broken_latest_checkpoint_is_skipped_for_the_previous_valid_one(
    tmp_path: Path, corruption: str
) -> None:
    corrupt, reason = CORRUPTIONS[corruption]
    write(tmp_path / "checkpoint_000000", 30)
    newest = write(tmp_path / "checkpoint_000001", 44)
    found = checkpoint.newest_in(tmp_path)
    assert found.state is not None and found.state["global_step"] == 44 and not found.skipped

    corrupt(newest)
    with pytest.raises(Unverified, match=reason):
        checkpoint.load(newest)
    found = checkpoint.newest_in(tmp_path)
    assert found.state is not None and found.state["global_step"] == 30
    assert len(found.skipped) == 1 and found.skipped[0].startswith("checkpoint_000001")
    warning = found.warning()
    assert warning is not None and "skipped 1 checkpoint that failed" in warning
    assert warning.endswith("resuming from step 30")
    checkpoint.check_resumable(tmp_path)  # one is valid: the driver lets the run start


def test_no_valid_checkpoint_is_refused_and_nothing_is_deleted(tmp_path: Path) -> None:
    checkpoint.check_resumable(tmp_path / "nowhere")  # a new run
    checkpoint.check_resumable(tmp_path)  # a run folder without checkpoints (yet)
    for (corrupt, _), index in zip(CORRUPTIONS.values(), range(3), strict=True):
        corrupt(write(tmp_path / f"checkpoint_00000{index}", 10 * index))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    with pytest.raises(NoValidCheckpoint, match="no valid checkpoint") as refused:
        checkpoint.check_resumable(tmp_path)
    assert isinstance(refused.value, RecipeError)  # the CLI's one line and exit 2
    assert str(refused.value).count("checkpoint_00000") == 3  # each one named, with why
    with pytest.raises(NoValidCheckpoint):
        checkpoint.latest(Registered(None), str(tmp_path))
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_newest_in_takes_the_most_steps_by_the_manifests(tmp_path: Path) -> None:
    assert checkpoint.newest_in(tmp_path).state is None
    write(tmp_path / "checkpoint_b", 30)
    write(tmp_path / "checkpoint_a", 44)
    write(tmp_path / "other", 99)  # not a checkpoint folder by Ray's naming
    (tmp_path / "checkpoint_manager_snapshot.json").write_text("{}")  # Ray's own, beside them
    found = checkpoint.newest_in(tmp_path)
    assert found.state is not None and found.state["global_step"] == 44
    assert found.skipped == [] and found.warning() is None


def test_latest_is_the_further_of_the_registered_and_the_disk(tmp_path: Path) -> None:
    run_dir = str(tmp_path)
    assert checkpoint.latest(Registered(None), run_dir).state is None
    write(tmp_path / "checkpoint_0", 44)
    # registered behind the disk: a worker died before the controller registered its report
    found = checkpoint.latest(Registered(state(30)), run_dir).state
    assert found is not None and found["global_step"] == 44
    found = checkpoint.latest(Registered(state(60)), run_dir).state
    assert found is not None and found["global_step"] == 60
    # remote storage is not scanned; no run folder, only the registered one
    assert checkpoint.latest(Registered(None), "s3://bucket/run").state is None
    found = checkpoint.latest(Registered(state(30)), None).state
    assert found is not None and found["global_step"] == 30


def test_a_broken_registered_checkpoint_is_passed_over_once(tmp_path: Path) -> None:
    """Ray keeps handing back its latest registered checkpoint even when it is broken."""
    write(tmp_path / "checkpoint_0", 30)
    newest = write(tmp_path / "checkpoint_1", 44)
    flip_a_byte(newest)
    found = checkpoint.latest(Registered(newest), str(tmp_path))
    assert found.state is not None and found.state["global_step"] == 30
    assert len(found.skipped) == 1  # the same folder, registered and on disk: named once
    with pytest.raises(NoValidCheckpoint):  # remote storage: nothing else to fall back on
        checkpoint.latest(Registered(newest), "s3://bucket/run")


def test_folder_reporter_keeps_checkpoints_as_ray_names_them(tmp_path: Path) -> None:
    reporter = FolderReporter(tmp_path / "run")
    assert reporter.registered() is None
    (tmp_path / "run").mkdir()
    reporter.report({"epoch": 0}, None)
    assert reporter.registered() is None
    for step in (44, 88):
        reporter.report({"epoch": step // 44}, write(tmp_path / f"tmp{step}", step))
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == [
        "checkpoint_000000",
        "checkpoint_000001",
    ]
    assert reporter.reports == [{"epoch": 0}, {"epoch": 1}, {"epoch": 2}]
    registered = reporter.registered()
    assert registered is not None and registered["global_step"] == 88


CHECK_WITHOUT_TORCH = """
import sys
from pathlib import Path
from trainforge import checkpoint

run_dir = Path(sys.argv[1])
checkpoint.check_resumable(run_dir)
print(checkpoint.newest_verified(run_dir).name, "torch" in sys.modules)
"""


def test_the_driver_checks_a_runs_checkpoints_without_importing_torch(tmp_path: Path) -> None:
    """Re-running a run name (a resume) checks its checkpoints in the driver before any worker
    starts; torch's import (1.5 s here) is left to the workers."""
    write(tmp_path / "checkpoint_000000", 30)
    truncate(write(tmp_path / "checkpoint_000001", 44))  # skipped: the one before is taken
    out = subprocess.run([sys.executable, "-c", CHECK_WITHOUT_TORCH, str(tmp_path)],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["checkpoint_000000", "False"]
