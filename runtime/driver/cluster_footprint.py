"""What the lasting local cluster holds on this machine: its processes (the supervisor and
everything under it: Ray's GCS, raylet, dashboard and its modules, agents, warm workers), the
memory they hold and the sockets they listen on.

Memory is PSS (proportional set size), summed: a page shared by several of the cluster's
processes (Python's and torch's libraries) is counted once in all, where RSS would count it in
each process (1.77 GB of PSS was 3.30 GB of RSS on this project's CPU, 24 processes).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import psutil

from trainforge import log, settings
from trainforge.driver import local_cluster

# PSS on this project's 2-core CPU after a digits run: Ray's own processes (GCS, raylet,
# dashboard and its nine modules, agents, client server, autoscaler monitor) 0.75 GB; a warm
# CPU worker or the warm tracker 0.31-0.38 GB each. A GPU worker holds more.
RAY_GB = 0.75
WARM_PROCESS_GB = 0.35


def cost_line(num_workers: int | None) -> str | None:
    """What the lasting cluster costs and how it goes, said the first time a command starts it
    for this home (a marker file in its folder), None after: the memory it holds (with
    ``num_workers`` warm workers and a tracker; None: Ray's own), when it stops, and the one
    setting under which nothing outlives a command."""
    marker = local_cluster.folder() / "cost-said"
    marker.parent.mkdir(parents=True, exist_ok=True)
    try:
        marker.touch(exist_ok=False)  # made once: two commands at once say it once
    except FileExistsError:
        return None
    if num_workers is None:
        held = f"about {RAY_GB:.2f} GB of memory, and {WARM_PROCESS_GB:.2f} GB per warm worker"
    else:
        workers = log.counted(num_workers, "warm worker", "warm workers")
        size = RAY_GB + WARM_PROCESS_GB * (num_workers + 1)
        held = f"about {size:.1f} GB of memory (Ray, {workers} and a tracker)"
    idle_min = local_cluster.idle_stop_s() / 60
    return (f"ray: the local cluster holds {held} until {idle_min:.0f} min unused or `trainforge "
            f"cluster stop`; with {settings.WORKERS.name}=own nothing outlives a command (said "
            "once; `trainforge cluster status` shows what it holds)")  # fmt: skip


def processes(supervisor_pid: int) -> list[psutil.Process]:
    """The supervisor and every process under it, living now."""
    try:
        root = psutil.Process(supervisor_pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:  # gone meanwhile
        return []


def memory_pss(found: list[psutil.Process]) -> int:
    """Bytes of memory ``found`` hold, PSS summed (processes that end meanwhile count 0)."""
    total = 0
    for process in found:
        with contextlib.suppress(psutil.Error):
            total += process.memory_full_info().pss
    return total


@dataclass(frozen=True)
class Listener:
    pid: int
    name: str
    ip: str
    port: int

    @property
    def loopback(self) -> bool:
        # an IPv6 socket may bind 127.0.0.1 as ::ffff:127.0.0.1 (Ray's gRPC servers do)
        ip = self.ip.removeprefix("::ffff:")
        return ip.startswith("127.") or ip == "::1"


def listening(found: list[psutil.Process]) -> list[Listener]:
    """The TCP sockets ``found`` listen on, and their UDP sockets bound to an address."""
    listeners: list[Listener] = []
    for process in found:
        with contextlib.suppress(psutil.Error):
            name = process.name()
            for conn in process.net_connections(kind="inet"):
                if conn.status in (psutil.CONN_LISTEN, psutil.CONN_NONE) and not conn.raddr:
                    listeners.append(Listener(process.pid, name, conn.laddr.ip, conn.laddr.port))
    return listeners


def gigabytes(size: int) -> str:
    return f"{size / 1e9:.2f} GB"
