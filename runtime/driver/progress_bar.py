"""A run's progress bar in a terminal, drawn by tqdm from rank 0's events
(``progress_events.py``): as wide as the terminal at each redraw, every line the command writes
meanwhile put above it (``log.write_around``), and left on a line of its own at its last frame
when the run ends, so the closing table or the Ctrl-C line starts on a clean line.

tqdm rather than rich (Lightning's other bar): tqdm is installed with the runtime anyway and
draws one line with carriage returns, which every terminal takes.
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from collections.abc import Iterator
from typing import IO, Any

from trainforge import log
from trainforge.progress_events import Event

WITH_TOTAL = "{desc} {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"
WITHOUT_TOTAL = "{desc} step {n_fmt} [{elapsed}{postfix}]"  # until early stopping ends the run
MIN_BAR = 10  # the bar's own columns that the loss and the rate give way to in a narrow terminal
# what surrounds the description, the counts and the postfix on a line WITH_TOTAL draws
WITH_TOTAL_FIXED = len(" 100%|| / [00:00<00:00, ]")


@functools.cache
def tqdm_class() -> type[Any]:
    """tqdm's bar class, imported with the first bar (not at the command's start: 0.04-0.05 s
    here), without tqdm's monitor thread: the bar is redrawn as events come."""
    from tqdm import tqdm

    class Tqdm(tqdm):  # type: ignore[type-arg]
        monitor_interval = 0

    return Tqdm


class Bar:
    """The bar of one run (``step``, ``finish``), on ``out``, a terminal."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self._tqdm: Any = None  # tqdm's bar while one is drawn
        self._last: Event | None = None  # the last step's event: its loss stays on the bar
        self._lock = threading.RLock()  # Ray's log thread and the command's own lines

    def step(self, event: Event) -> None:
        with self._lock:
            bar = self._tqdm
            if bar is None or event["step"] < bar.n or event.get("total") != bar.total:
                self.close(keep=False)  # a restarted attempt resumes behind it: a new bar
                bar = self._open(event, self._postfix(event))
            bar.set_description_str(_epoch(event), refresh=False)
            bar.set_postfix_str(self._postfix(event), refresh=False)
            self._last = event
            bar.update(event["step"] - bar.n)

    def finish(self, event: Event) -> None:
        """The run's last step, logged or not, then the bar's last frame on its own line: at
        100 % (a run that early stopping ended before its planned steps ends its bar there)."""
        with self._lock:
            bar = self._tqdm if self._tqdm is not None else self._open(event)
            if bar.total is not None:
                bar.total = event["step"]
            bar.n = event["step"]
            if self._last is not None:  # the run's rate, as on the finish line below the bar
                rate = event.get("samples_per_s") or self._last["samples_per_s"]
                bar.set_postfix_str(self._postfix({**self._last, **event, "samples_per_s": rate}),
                                    refresh=False)  # fmt: skip
            self.close()

    def close(self, keep: bool = True) -> None:
        """The last frame stays, the cursor on the next line (``keep``), or is erased."""
        with self._lock:
            if self._tqdm is not None:
                log.write_around(None)
                self._tqdm.leave = keep
                self._tqdm.close()
                self._tqdm, self._last = None, None

    def _open(self, event: Event, postfix: str = "") -> Any:
        """A bar at ``event``'s step, drawn at once."""
        total = event.get("total")
        # a terminal that says its size: followed as it is resized; one that says none (a
        # new pseudo-terminal: 0×0), 80×24, since tqdm draws nothing on a screen of no size
        sized = terminal_size(self.out) is not None
        self._tqdm = tqdm_class()(
            total=total, initial=event["step"], file=self.out, leave=True, dynamic_ncols=sized,
            ncols=None if sized else 80, nrows=None if sized else 24,
            position=0,  # one bar: never below a bar another run left open
            mininterval=0,  # every event drawn: they come at the logging cadence, not per step
            desc=_epoch(event), postfix=postfix,
            bar_format=WITH_TOTAL if total is not None else WITHOUT_TOTAL,
        )  # fmt: skip
        log.write_around(self._above)
        return self._tqdm

    @contextlib.contextmanager
    def _above(self) -> Iterator[None]:
        """A line written while the bar is drawn: the bar cleared first, drawn again below."""
        with self._lock:
            bar = self._tqdm
            if bar is not None:
                bar.clear()
            try:
                yield
            finally:
                if bar is not None and bar is self._tqdm:
                    bar.refresh()

    def _postfix(self, event: Event) -> str:
        """The loss and the rate after the counts, as much of them as leaves the bar its
        ``MIN_BAR`` columns."""
        loss, rate = f"loss {event['loss']:.4f}", f"{event['samples_per_s']:,.0f} samples/s"
        total = event.get("total")
        fixed = len(_epoch(event)) + WITH_TOTAL_FIXED + 2 * len(str(total)) + MIN_BAR
        if total is None:
            fixed = len(_epoch(event)) + len(" step  [00:00, ]") + len(str(event["step"]))
        room = columns(self.out) - fixed
        return next((text for text in (f"{loss}, {rate}", loss) if len(text) <= room), "")


def _epoch(event: Event) -> str:
    epoch, epochs = max(1, event.get("epoch") or 1), event.get("epochs")
    return f"epoch {epoch}/{epochs}" if epochs is not None else f"epoch {epoch}"


def columns(out: IO[Any]) -> int:
    """The terminal's width; 80 where it tells none."""
    size = terminal_size(out)
    return size.columns if size is not None else 80


def terminal_size(out: IO[Any]) -> os.terminal_size | None:
    """The terminal's size; None for a stream that is no terminal, or a terminal whose size
    nobody set (0×0)."""
    try:
        size = os.get_terminal_size(out.fileno())
    except (OSError, ValueError, AttributeError):
        return None
    return size if size.columns > 0 and size.lines > 0 else None
