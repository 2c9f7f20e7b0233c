"""A real pseudo-terminal of a given width, and the screen a terminal shows for what was written
to it (the ``pyte`` emulator: wrapping at the width, carriage returns, erasures)."""

from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import termios
import threading
from collections.abc import Sequence
from typing import IO

import pyte

ROWS = 300  # tall enough that nothing a test writes scrolls off the screen


class Terminal:
    """A pseudo-terminal ``columns`` wide: ``file`` (or ``fd``) is its terminal side, what is
    written there is read from the other side as it comes (a full buffer would block the
    writer), and ``screen()`` is what a terminal shows of it."""

    def __init__(self, columns: int, sized: bool = True) -> None:
        """``sized`` False: the terminal tells no size (0×0, as a new pseudo-terminal whose
        size nobody set); its screen is still rendered ``columns`` wide."""
        self.columns = columns
        self._controller, self.fd = os.openpty()
        if sized:
            fcntl.ioctl(self.fd, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, columns, 0, 0))
        self.file: IO[str] = open(self.fd, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        self._written: list[bytes] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        while True:
            try:
                chunk = os.read(self._controller, 65536)
            except OSError:  # every terminal side closed (Linux: EIO)
                return
            if not chunk:
                return
            self._written.append(chunk)

    def close(self) -> bytes:
        """Everything written, once every writer has closed its side."""
        self.file.close()
        os.close(self.fd)
        self._reader.join(timeout=30)
        os.close(self._controller)
        return b"".join(self._written)

    def screen(self) -> list[str]:
        """The lines the terminal shows at the end (closes it), trailing blanks dropped."""
        return screen_of(self.close(), self.columns)


def screen_of(written: bytes, columns: int) -> list[str]:
    """The lines a ``columns``-wide terminal shows after ``written`` (newlines already "\\r\\n",
    as a terminal's line discipline makes them)."""
    shown = pyte.Screen(columns, ROWS)
    pyte.ByteStream(shown).feed(written)
    lines = [line.rstrip() for line in shown.display]
    while lines and not lines[-1]:
        lines.pop()
    return lines


def frames(written: bytes) -> list[str]:
    """Each stretch of text between carriage returns and newlines, escape sequences dropped:
    every frame of a bar redrawn in place."""
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", written.decode("utf-8", errors="replace"))
    return [part for part in re.split(r"[\r\n]", text) if part.strip()]


def run_in_terminal(
    command: Sequence[str], columns: int, timeout_s: float = 300, **popen: object
) -> tuple[int, list[str], bytes]:
    """``command`` with a ``columns``-wide terminal as its stdin, stdout and stderr: its exit
    status, the screen at its end and the bytes it wrote."""
    terminal = Terminal(columns)
    try:
        process = subprocess.Popen(command, stdin=terminal.fd, stdout=terminal.fd,
                                   stderr=terminal.fd, start_new_session=True,
                                   **popen)  # type: ignore[call-overload]  # fmt: skip
        code = process.wait(timeout=timeout_s)
    finally:
        written = terminal.close()
    return code, screen_of(written, terminal.columns), written
