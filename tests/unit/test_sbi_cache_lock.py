"""One command at a time makes a data stage's output (``driver/stage.Runner.one_maker``, around
a simulation cache entry): another command on the same recipe waits for it, saying what is on
disk, and then finds the entry whole, or makes what is missing where the first was killed. Real
processes holding a real lock."""

from __future__ import annotations

import multiprocessing
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from trainforge.driver import stage
from trainforge.workloads.sbi import simulations

PROCESSES = multiprocessing.get_context("fork")


def on_disk(folder: Path) -> str:
    return f"{len(list(folder.glob('chunk-*')))}/2 chunks on disk"


def making(folder: Path, say: Any) -> Any:
    """As the simulation stage takes its entry."""
    return stage.Runner().one_maker(folder, "simulations", say, lambda: on_disk(folder))


def hold(folder: Path, holding: Any, release: Any) -> None:
    """Another command: making the entry until ``release``."""
    with making(folder, lambda _: None):
        holding.set()
        release.wait(60)


@pytest.fixture
def maker(tmp_path: Path) -> Any:
    holding, release = PROCESSES.Event(), PROCESSES.Event()
    process = PROCESSES.Process(target=hold, args=(tmp_path, holding, release))
    process.start()
    assert holding.wait(30)
    process.release = release
    yield process
    if process.is_alive():  # (a killed waiter leaves the event's condition waiting for it)
        release.set()
    process.join(30)


def test_a_command_waits_for_the_one_making_the_entry_and_reuses_it(
    tmp_path: Path, maker: Any
) -> None:
    def finished() -> None:  # the maker writes the manifest last, then ends
        (tmp_path / simulations.MANIFEST).write_text("{}")
        maker.release.set()

    threading.Timer(0.5, finished).start()
    said: list[str] = []
    with making(tmp_path, said.append):
        assert (tmp_path / simulations.MANIFEST).exists()  # the other made it all
    assert said == [f"simulations: another command (pid {maker.pid}) is making these; "
                    f"waiting for it → {tmp_path}"]  # fmt: skip


def test_a_command_makes_what_a_killed_maker_left(
    tmp_path: Path, maker: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(stage, "WAIT_SAY_EVERY_S", 0.3)
    simulations.chunk_file(tmp_path, 0).write_bytes(b"")  # the one chunk it wrote
    threading.Timer(1.0, maker.kill).start()  # its lock goes with it
    said: list[str] = []
    with making(tmp_path, said.append):
        assert not (tmp_path / simulations.MANIFEST).exists()  # this command makes the rest
        assert (tmp_path / stage.MAKER_FILE).read_text() == f"{os.getpid()}\n"
    assert f"simulations: waiting for pid {maker.pid}: 1/2 chunks on disk" in said
