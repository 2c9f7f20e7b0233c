"""A pytest plugin for device runs (``-p bench.pytest_report_now``): each failing test's report is
written to ``$OUT/failures.log`` as it fails, and ``$STACKS_AFTER_S`` seconds after pytest
started every thread's stack is written to ``$OUT/stacks.log`` (set it a little before the
step's limit). Why: a pytest stopped at a step's limit while its session hangs prints no report
at all, and the failure's reason is lost (the thirty-fourth session lost one so)."""

from __future__ import annotations

import faulthandler
import os
import time
from pathlib import Path
from typing import Any

import pytest

OUT = Path(os.environ.get("OUT", "."))
_stacks = (OUT / "stacks.log").open("a")  # open for the process's life: faulthandler writes to it
_after = os.environ.get("STACKS_AFTER_S")
_deadline = time.monotonic() + float(_after) if _after else None


def _arm() -> None:
    """The stack dump at the deadline, by faulthandler's own thread (it needs no GIL)."""
    if _deadline is not None and _deadline > time.monotonic():
        faulthandler.dump_traceback_later(_deadline - time.monotonic(), file=_stacks)


_arm()


@pytest.hookimpl(trylast=True)
def pytest_exception_interact() -> None:
    _arm()  # pytest's faulthandler plugin cancels any pending dump here, at every failure


def pytest_runtest_logreport(report: Any) -> None:
    if not report.failed:
        return
    with (OUT / "failures.log").open("a") as failures:
        failures.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext}\n")
        for name, text in report.sections:
            failures.write(f"---- {name}\n{text[-20000:]}\n")
