"""What a workload's data stage hands the driver to run: a family never starts clusters, pools
or processes itself. The driver gives the stage a ``StageRunner`` (``driver/stage.py``), which
runs two kinds of work:

- ``Tasks``: independent tasks over a list of items, spread over the cluster's processes — the
  lasting local cluster's warm simulators, one process per GPU for the stage, or Ray's own
  tasks — a few items each, as the family's sizer says; each finished task's result reaches the
  family in the command as it comes (``done``). A process lost mid-stage (killed, out of
  memory) is dropped and its items are given again.
- one function in a process of the command's own on this machine (``start_in_command``), for
  a stage of seconds, started before the cluster is reached so that it overlaps Ray's start.

No torch and no Ray here: the registry's modules import this one.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol


@dataclass(frozen=True)
class Tasks:
    """A stage's tasks. ``function(items, *args)`` runs in a task (a module-level function:
    it is pickled by reference), with the command's environment; its result comes back."""

    function: Callable[..., Any]
    args: tuple[Any, ...]
    items: list[Any]
    device: str
    """``cpu``: a task holds ``cpus`` CPUs; ``cuda``: one GPU."""
    cpus: float
    placed: Callable[[int, str], Callable[[int], int]]
    """Called once the stage's processes are found, with how many tasks run at once and where
    (``2 CPUs (2 warm simulators)``); returns how many items the next task takes, given how
    many are left."""
    done: Callable[[list[Any], Any, str], None]
    """Called in the command for each finished task: its items, its result, and where it ran
    (``node:pid``)."""
    label: str = "stage"
    """What the runner's own lines begin with (``simulations``)."""
    noun: str = "items"
    """What the items are called in those lines."""


class StageRunner(Protocol):
    def resources(self) -> dict[str, float]:
        """The CPUs and GPUs of the cluster the stage runs on."""
        ...

    def one_maker(self, folder: Path, label: str, say: Callable[[str], None],
                  progress: Callable[[], str]) -> AbstractContextManager[None]:  # fmt: skip
        """This command alone makes what goes into ``folder``: another command making the same
        is waited for, saying so (``label: …``) with ``progress()`` now and then; the family
        then looks at what that one made."""
        ...

    def run(self, tasks: Tasks) -> None:
        """Every item through tasks, until all are done (``Tasks``)."""
        ...

    def start_in_command(self, key: str, function: Callable[..., Any], args: tuple[Any, ...]
                         ) -> bool:  # fmt: skip
        """Start ``function(*args)`` in a process of the command's own; False where one under
        ``key`` was started already."""
        ...

    def started_in_command(self, key: str) -> float | None:
        """When (``time.time()``) the process under ``key`` was started, if it was."""
        ...

    def wait_in_command(self, key: str, progress: Callable[[], None], every_s: float) -> None:
        """Wait for the process under ``key``, calling ``progress`` every ``every_s``; raises
        its error (a ``RecipeError`` as itself) if it failed."""
        ...
