"""The one ``[trainforge]`` voice, for the driver and the workers alike.

Lines are written to the stream directly, not with print(): Ray Train patches print in its
workers and a printed line would appear twice in the driver's console.
"""

from __future__ import annotations

import sys

PREFIX = "[trainforge]"
_warned: set[str] = set()


def say(text: str) -> None:
    """One progress or result line on stdout."""
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
