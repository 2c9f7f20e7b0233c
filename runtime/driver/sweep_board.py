"""A sweep's live board in a terminal: a bar of the trials ended out of the sweep's count, and
under it the best trials so far (the metric, its epoch, their settings), redrawn as Tune's
results come; the sweep's lines go above it (``log.write_around``). It is erased when the
sweep ends (the closing table says the same, whole). Where stdout is no terminal (a log
file, CI) no board is drawn: the lines say each change.

tqdm draws it, as it draws a run's bar (``progress_bar.py``): the bar, then ``ROWS`` lines of
text only.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import IO, Any

from trainforge import log
from trainforge.driver.progress_bar import columns, terminal_size, tqdm_class

ROWS = 3  # the best trials shown
BAR = "{desc} {n_fmt}/{total_fmt} ended{postfix} |{bar}| {elapsed}"

_drawn: Board | None = None  # the board on the screen, which `close_drawn` erases


class Board:
    def __init__(self, out: IO[str], total: int, title: str) -> None:
        global _drawn
        close_drawn()
        sized = terminal_size(out) is not None
        common: dict[str, Any] = {"file": out, "leave": False, "dynamic_ncols": sized,
                                  "ncols": None if sized else 80, "mininterval": 0}  # fmt: skip
        self.out = out
        self._lock = threading.RLock()  # Tune's callbacks and the command's own lines
        self._bar = tqdm_class()(total=total, desc=title, position=0, bar_format=BAR, **common)
        self._rows = [tqdm_class()(total=0, position=i + 1, bar_format="{desc}", **common)
                      for i in range(ROWS)]  # fmt: skip
        _drawn = self
        log.write_around(self._above)

    def show(self, ended: int, running: int, best: list[str]) -> None:
        """``ended`` trials out of the count, ``running`` now, and the best rows' texts."""
        width = columns(self.out) - 1
        with self._lock:
            self._bar.set_postfix_str(f"{running} running", refresh=False)
            self._bar.n = ended
            self._bar.refresh()
            for row, text in zip(self._rows, [*best, *[""] * ROWS], strict=False):
                row.set_description_str(text[:width])

    def close(self) -> None:
        global _drawn
        with self._lock:
            log.write_around(None)
            for bar in [*reversed(self._rows), self._bar]:
                bar.close()
            if _drawn is self:
                _drawn = None

    @contextlib.contextmanager
    def _above(self) -> Iterator[None]:
        """A line written while the board is drawn: the board cleared first, drawn again
        below it."""
        with self._lock:
            for bar in [self._bar, *self._rows]:
                bar.clear()
            try:
                yield
            finally:
                for bar in [self._bar, *self._rows]:
                    bar.refresh()


def close_drawn() -> None:
    """Erase the board on the screen, if any (the sweep ended, or was interrupted)."""
    if _drawn is not None:
        _drawn.close()
