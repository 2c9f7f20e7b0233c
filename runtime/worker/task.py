"""One task of a data stage (``workloads/stage.py``), in whatever process runs it: a Ray task, a
warm simulator or a stage process of the cluster (``run``), or a process of the command's own
(``python -m trainforge.worker.task``, ``main``)."""

from __future__ import annotations

import os
import pickle
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

from trainforge.errors import RecipeError
from trainforge.worker import environment

RECIPE_ERROR = "recipe error: "  # how the command's own process tells a RecipeError


def run(
    function: Callable[..., Any], items: list[Any], args: tuple[Any, ...], env: dict[str, str]
) -> tuple[Any, str]:
    """``function(items, *args)`` with the command's environment ``env`` (a user's simulator
    may read variables of its own, and the process may be the lasting cluster's), and where it
    ran: ``node:pid``."""
    with environment.applied(env):
        return function(items, *args), f"{_node()}:{os.getpid()}"


def _node() -> str:
    """The Ray node this process runs on (two raylets on one host share its name), else the
    host."""
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            return str(ray.get_runtime_context().get_node_id())
    return socket.gethostname()


def main() -> None:
    """A process of the command's own: the pickled (function, args) on stdin, ``function(*args)``
    run once. A Ctrl-C is the command's to handle: it ends this process (SIGTERM; ``finally``
    blocks remove half-written files on the way out)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    function, args = pickle.load(sys.stdin.buffer)
    try:
        function(*args)
    except RecipeError as exc:  # one line for the command to raise again, no traceback
        sys.stderr.write(f"{RECIPE_ERROR}{' '.join(str(exc).split())}\n")
        sys.exit(2)


if __name__ == "__main__":
    main()
