"""A worker process of a cold command's own (``driver/own_workers.py``): the warm pool's worker
(``worker/warm.py``: its imports, its CUDA context, its ``run``) in a plain
process that the command started, for one run.

It talks with the command over a connection (a socket pair; the command passes its end's file
descriptor as the argument). The first message is (Python path, the command's pid, its GPU or
None, what the run imports beyond torch and the loop): it imports torch, the loop and those,
and makes its CUDA context, at once. Then it answers requests until the connection closes (the
command needs the process no more): ("run", payload, rank, world size, store port), sent once
the command has made the data, is one run of the loop. Each answer is ("ok", what rank 0
reported last) or ("failed", exception). The process ends with its command (``WarmWorker``
checks that it lives), so a killed command leaves no loop running.

    python -m trainforge.worker.own FD
"""

from __future__ import annotations

import pickle
import sys
import traceback
from multiprocessing.connection import Connection
from typing import Any


def main(fd: int) -> int:
    connection = Connection(fd)
    sys_path, driver_pid, gpu, imports = connection.recv()
    from trainforge.worker.warm import WarmWorker

    worker = WarmWorker(sys_path, driver_pid, float("inf"), gpu, imports)
    while True:
        try:
            kind, *request = connection.recv()
        except EOFError:  # the command needs this process no more
            return 0
        answer: tuple[str, Any]
        try:
            assert kind == "run", f"a worker of a command's own runs the loop, not {kind!r}"
            payload, rank, world_size, port = request
            answer = ("ok", worker.run(payload, rank, world_size, port, driver_pid))
        except BaseException as exc:  # every failure goes back to the command
            answer = ("failed", portable(exc))
        connection.send(answer)


def portable(exc: BaseException) -> BaseException:
    """``exc`` if it survives pickling (the command tells a NaN verdict by its class), else a
    RuntimeError that carries its class, message and traceback as text."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # a class that pickle cannot rebuild
        text = "".join(traceback.format_exception(exc)).rstrip()
        return RuntimeError(f"{type(exc).__name__}: {exc}\n{text}")


if __name__ == "__main__":
    sys.exit(main(int(sys.argv[1])))
