"""Run storage: a local folder, or a URI that only Ray Train's storage layer reaches."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainforge import storage


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
