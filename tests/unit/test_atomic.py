"""Atomic file replacement: the target is the old file or the whole new one, nothing between."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainforge.atomic import replacing


def test_a_written_file_replaces_the_target_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    target = tmp_path / "manifest.json"
    target.write_text("old")
    with replacing(target) as temporary:
        assert temporary.parent == tmp_path and temporary != target
        temporary.write_text("new")
        assert target.read_text() == "old"  # readers see the old file until the rename
    assert target.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["manifest.json"]


def test_an_error_while_writing_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "chunk.pt"
    target.write_text("old")
    with pytest.raises(RuntimeError), replacing(target) as temporary:
        temporary.write_text("half")
        raise RuntimeError("disk full")
    assert target.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chunk.pt"]
