"""Rank 0's progress as events, not text: the workers write each one as a marked JSON line
through the channels every worker line takes (Ray's relayed output, the warm and own workers'
line file), and the driver reads it back to draw a bar in a terminal
(``driver/progress_bar.py``) or to print the plain line it stands for (``text``) in a log, in
CI and in the run folder's worker-output.log.

Three kinds: ``step`` (a logging step), ``epoch`` (an epoch's end and its metrics) and
``finish`` (the run's last step, logged or not).
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from typing import Any

from trainforge import log

MARK = "[trainforge:progress]"
"""What begins an event's line: no line of any other kind begins so."""

Event = dict[str, Any]


def emit(kind: str, **fields: Any) -> None:
    """One event on stdout (rank 0 only: the caller decides)."""
    log.write(sys.stdout, line(kind, **fields) + "\n")


def line(kind: str, **fields: Any) -> str:
    """The line that carries one event."""
    return f"{MARK} {json.dumps({'kind': kind, **fields}, default=float)}"


def read(line: str) -> Event | None:
    """The event ``line`` carries (None: an ordinary line, or one cut short)."""
    if not line.startswith(MARK + " "):
        return None
    try:
        event = json.loads(line[len(MARK) + 1 :])
    except ValueError:
        return None
    return event if isinstance(event, dict) and "kind" in event else None


def text(event: Event) -> str:
    """The plain line an event stands for (without ``[trainforge]``), as in a log file."""
    kind = event["kind"]
    if kind == "step":
        return _step_text(event)
    if kind == "epoch":
        shown = " ".join(f"{key} {value:.4f}" for key, value in event["metrics"].items())
        return f"{_of('epoch', event['epoch'], event.get('epochs'))} done: {shown}"
    rate = event.get("samples_per_s")
    rate_text = f", {rate:,.0f} samples/s" if rate is not None else ""
    return f"finished at step {event['step']} in {event['seconds']:.1f} s{rate_text}"


def _step_text(event: Event) -> str:
    where = (
        f"{_of('epoch', event['epoch'], event.get('epochs'))} "
        f"{_of('step', event['step'], event.get('total'))}"
    )
    if event.get("eta_s") is None:  # until early stopping: no end to count down to
        eta = "early stop"
    else:  # with early stopping the planned steps are only an upper bound
        eta = f"{'≤ ' if event.get('eta_bound') else ''}{timedelta(seconds=round(event['eta_s']))}"
    return (
        f"{where} loss {event['loss']:.4f} lr {event['lr']:.2e} "
        f"{event['samples_per_s']:,.0f} samples/s {event['step_ms']:.1f} ms/step eta {eta}"
    )


def _of(name: str, count: int, total: int | None) -> str:
    return f"{name} {count}/{total}" if total is not None else f"{name} {count}"


def as_text(line: str) -> str:
    """``line``, or the ``[trainforge]`` line of the event it carries: for where lines are
    shown as they come (Ray's own printer under -v)."""
    event = read(line)
    return line if event is None else f"{log.PREFIX} {text(event)}"
