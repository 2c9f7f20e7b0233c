"""A pytest plugin for device runs (``-p bench.pytest_report_now``): each failing test's report is
written to ``$OUT/failures.log`` as it fails, and SIGUSR1 dumps every thread's stack to
``$OUT/stacks.log``. Why: a pytest stopped at a step's limit while its session hangs prints no
report at all, and the failure's reason is lost (the thirty-fourth session lost one so)."""

from __future__ import annotations

import faulthandler
import os
import signal
from pathlib import Path
from typing import Any

OUT = Path(os.environ.get("OUT", "."))
_stacks = (OUT / "stacks.log").open("a")  # open for the process's life: faulthandler writes to it
faulthandler.register(signal.SIGUSR1, file=_stacks, all_threads=True)


def pytest_runtest_logreport(report: Any) -> None:
    if not report.failed:
        return
    with (OUT / "failures.log").open("a") as failures:
        failures.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext}\n")
        for name, text in report.sections:
            failures.write(f"---- {name}\n{text[-20000:]}\n")
