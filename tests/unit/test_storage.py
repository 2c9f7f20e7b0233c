"""Run storage: a local folder, or a URI that only Ray Train's storage layer reaches; a local
folder that cannot be written is refused in one line naming it and the problem."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainforge import storage
from trainforge.errors import RecipeError


@pytest.mark.parametrize("uri", ["s3://bucket/runs", "gs://b/r", "file:///tmp/runs"])
def test_a_uri_has_no_local_folder_and_passes_through(uri: str) -> None:
    assert storage.is_uri(uri)
    assert storage.local_folder(uri) is None
    assert storage.absolute(uri) == uri


def test_a_path_is_a_local_folder_made_absolute(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert not storage.is_uri("./runs")
    assert storage.local_folder("runs") == Path("runs")
    assert storage.local_folder(None) is None
    assert storage.absolute("./runs") == str(tmp_path.resolve() / "runs")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert storage.absolute("~/runs") == str(tmp_path.resolve() / "runs")


def test_a_writable_storage_path_is_made_and_left_as_it_was(tmp_path: Path) -> None:
    storage.check_writable(str(tmp_path / "runs"), "r")
    assert list((tmp_path / "runs").iterdir()) == []  # made (as the run would), probe gone
    (tmp_path / "runs" / "r").mkdir()  # a resume: its run folder is tried too
    storage.check_writable(str(tmp_path / "runs"), "r")
    assert [p.name for p in (tmp_path / "runs").rglob("*")] == ["r"]
    storage.check_writable("s3://bucket/runs", "r")  # Ray Train's to reach


def test_a_storage_path_through_a_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    blocker = tmp_path / "notes.txt"
    blocker.write_text("not a folder")
    for location in (blocker / "runs", blocker):
        with pytest.raises(RecipeError) as refused:
            storage.check_writable(str(location), "r")
        assert str(refused.value) == (
            f"run.storage_path: cannot write in {location}: {blocker} is a file, not a folder"
        )
    assert blocker.read_text() == "not a folder"


def test_a_folder_even_root_cannot_write_in_is_refused() -> None:
    # sysfs refuses new files to root too: a real refusal, as a read-only mount gives
    with pytest.raises(RecipeError, match=r"^run\.storage_path: cannot write in /sys: "):
        storage.check_writable("/sys", "r")
