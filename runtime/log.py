"""The one ``[trainforge]`` voice, for the driver and the workers alike.

Lines are written to the stream directly, not with print(): Ray Train patches print in its
workers and a printed line would appear twice in the driver's console.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import IO

PREFIX = "[trainforge]"
STARTED_AT = time.time()  # about when the command started: the CLI imports this module first
_warned: set[str] = set()
_verbosity = 0  # -1 quiet (-q), 0 normal, 1 verbose (-v): set once by the CLI
_around: Callable[[], AbstractContextManager[object]] | None = None


def set_verbosity(level: int) -> None:
    global _verbosity
    _verbosity = level


def verbosity() -> int:
    return _verbosity


def phase(name: str, text: str, since: float) -> None:
    """One start-up phase and its duration (``since``: a ``time.time()`` taken when the phase
    began, possibly in another process), so the user sees what the seconds before the first
    step are for: ``ray: connected to the local cluster at … (0.1 s)``."""
    say(f"{name}: {text} ({max(0.0, time.time() - since):.1f} s)")


def counted(n: int, one: str, many: str) -> str:
    """``n`` and the noun that fits it: ``1 epoch``, ``2 epochs``."""
    return f"{n} {one if n == 1 else many}"


def say(text: str) -> None:
    """One progress line on stdout (not under -q)."""
    if _verbosity >= 0:
        result(text)


def result(text: str) -> None:
    """A line that is shown even under -q: the run's outcome."""
    write(sys.stdout, f"{PREFIX} {text}\n")


def warn(message: str, key: str | None = None) -> None:
    """A problem worth knowing that does not stop the run, said once per ``key`` (default the
    message itself) on stderr, not once per step."""
    key = key or message
    if key in _warned:
        return
    _warned.add(key)
    write(sys.stderr, f"{PREFIX} warning: {message}\n")


def refuse(message: str) -> None:
    """What the user asked for cannot be done (a RecipeError): one line in the style of a
    command-line tool's usage errors, before anything started."""
    write(sys.stderr, f"trainforge: error: {message}\n")


def error(message: str) -> None:
    """A line about why the command failed, on stderr."""
    write(sys.stderr, f"{PREFIX} {message}\n")


def write_around(around: Callable[[], AbstractContextManager[object]] | None) -> None:
    """Every line written from now on is written inside ``around()`` (None: no longer): a
    progress bar drawn in the terminal takes itself away before a line and draws itself again
    below it, so no line is glued to it."""
    global _around
    _around = around


def write(stream: IO[str], text: str) -> None:
    """``text`` to ``stream``, flushed; a reader gone silences the stream (``silence``)."""
    around = _around
    if around is None:
        _write(stream, text)
        return
    with around():
        _write(stream, text)


def _write(stream: IO[str], text: str) -> None:
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        silence(stream)


def silence(stream: IO[str]) -> None:
    """The reader of ``stream`` went away (``trainforge recipes | head -3``): its later lines
    go to /dev/null instead of raising BrokenPipeError, so a run still goes on to its end, its
    checkpoints and its MLflow run, and no traceback follows the lines that were read."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, stream.fileno())
    finally:
        os.close(devnull)


def first_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as one short line: its first line of text, else its type's name."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:limit]
