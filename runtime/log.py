"""The one ``[trainforge]`` voice, for the driver and the workers alike.

Lines are written to the stream directly, not with print(): Ray Train patches print in its
workers and a printed line would appear twice in the driver's console.
"""

from __future__ import annotations

import sys
import time

PREFIX = "[trainforge]"
STARTED_AT = time.time()  # about when the command started: the CLI imports this module first
_warned: set[str] = set()
_verbosity = 0  # -1 quiet (-q), 0 normal, 1 verbose (-v): set once by the CLI


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


def say(text: str) -> None:
    """One progress line on stdout (not under -q)."""
    if _verbosity >= 0:
        result(text)


def result(text: str) -> None:
    """A line that is shown even under -q: the run's outcome."""
    sys.stdout.write(f"{PREFIX} {text}\n")
    sys.stdout.flush()


def warn(message: str, key: str | None = None) -> None:
    """A problem worth knowing that does not stop the run, said once per ``key`` (default the
    message itself) on stderr, not once per step."""
    key = key or message
    if key in _warned:
        return
    _warned.add(key)
    sys.stderr.write(f"{PREFIX} warning: {message}\n")
    sys.stderr.flush()


def refuse(message: str) -> None:
    """What the user asked for cannot be done (a RecipeError): one line in the style of a
    command-line tool's usage errors, before anything started."""
    sys.stderr.write(f"trainforge: error: {message}\n")
    sys.stderr.flush()


def error(message: str) -> None:
    """A line about why the command failed, on stderr."""
    sys.stderr.write(f"{PREFIX} {message}\n")
    sys.stderr.flush()


def first_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as one short line: its first line of text, else its type's name."""
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:limit]
