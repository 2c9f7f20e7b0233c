"""The Ray cluster a run uses: joining it (or starting a local one), and where runs are stored.
Whether it can host the recipe's workers is decided by ``trainforge.config.resolve``."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from typing import Any

from trainforge import log, ray_compat, settings, storage
from trainforge.config.schema import RunSection
from trainforge.driver import local_cluster, reaper
from trainforge.errors import RecipeError

GCS_PORT_ENV = "RAY_GCS_SERVER_PORT"
PREEMPTION_WATCHER_ENV = "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER"
_held = contextlib.ExitStack()  # the lasting cluster's in-use lock, held until this process ends
_private = False  # whether the Ray this process joined is the private one it started


def connect(local_only: bool = False, **init_options: Any) -> None:
    """Join the cluster in RAY_ADDRESS (as under `ray job submit`), else the lasting local
    cluster (started when none runs; ``local_cluster.py``), else — where none is kept
    (``TRAINFORGE_WORKERS`` own or private) or ``local_only`` — start a private Ray that ends
    with this process.

    Every process of the job is given its own cluster's address (RAY_ADDRESS in the job's
    runtime env). Ray Train's placement-group cleaner (which this runtime does not start:
    ``ray_compat.trainer_class``), a detached actor, asks the State API whether the run's
    controller lives; without RAY_ADDRESS that API asks the cluster named in
    /tmp/ray/ray_current_cluster (the last `ray start` on the machine). Another live cluster
    there has no such controller, and the cleaner removes the run's placement group: a healthy
    run is killed. A dead one makes each query wait ~40 s for its GCS, and the end of every run
    waited 12 s for the cleaner to stop (measured on this project's CPU). A local Ray therefore
    gets a known GCS port, which every process of the job is pinned to.
    """
    import ray

    if ray.is_initialized():
        return
    ray_compat.skip_unused_serializer_addons()
    with ray_compat.keeping_sigterm_handler():
        said = _connect(ray, local_only, init_options)
    if log.verbosity() <= 0:  # -v shows everything Ray says
        ray_compat.quiet_ray_printer()
    if said:  # once the handler is back: a stop right after this line ends with one line too
        log.say(said)


def _connect(ray: Any, local_only: bool, init_options: dict[str, Any]) -> str | None:
    """Join or start Ray; returns the phase line to show, if any."""
    # Ray's own INFO lines ("Connecting to existing Ray cluster…") only under -v
    level = logging.INFO if log.verbosity() > 0 else logging.WARNING
    options = {"log_to_driver": True, "dashboard_host": "127.0.0.1", "logging_level": level,
               **init_options}  # fmt: skip
    address = None if local_only else os.environ.get("RAY_ADDRESS")
    if address:
        refuse_unreachable(address)
        if "RAY_AUTH_MODE" not in os.environ and ray_compat.token_on_this_machine():
            ray_compat.use_token_mode()  # the cluster may want it; one that does not ignores it
        ray_compat.poll_controller_fast()
        try:
            _init_pinned(ray, address, address, options)
        except ConnectionError as exc:  # something listens there, but no GCS (Ray tried ~20 s)
            raise RecipeError(
                f"RAY_ADDRESS={address}: no Ray cluster answers there ({exc}); check that it "
                f"names the head's GCS port (6379 unless `ray start --port` said otherwise), "
                f"{UNSET_HINT}"
            ) from None
        return None
    if not local_only and settings.keeps_cluster():
        return _join_lasting_cluster(ray, options)
    # Ray Train's preemption watcher is an extra actor process per run (and an error line on
    # the console); one machine has no node to be preempted.
    os.environ.setdefault(PREEMPTION_WATCHER_ENV, "0")
    ray_compat.poll_controller_fast()
    # "local": a new instance even when a `ray start` cluster runs on this machine (a bare
    # ray.init() would join that one). The local dashboard stays on loopback.
    started_at = time.time()
    if "RAY_AUTH_MODE" not in os.environ:
        ray_compat.use_token_mode()
    port = os.environ.get(GCS_PORT_ENV) or str(local_cluster.free_port())
    previous = os.environ.get(GCS_PORT_ENV)
    os.environ[GCS_PORT_ENV] = port  # read by Ray when it starts the local GCS
    cpus = local_cluster.usable_cpus()
    if cpus is not None:
        options.setdefault("num_cpus", cpus)
    try:
        _init_pinned(ray, "local", f"127.0.0.1:{port}", options)
    finally:
        if previous is None:
            del os.environ[GCS_PORT_ENV]
    if local_only:  # a test session's Ray, not a command's
        return None
    session = ray_compat.session_dir()
    if session is not None:  # its agents would outlive a SIGKILLed command by a minute
        reaper.watch(session)
    global _private
    _private = True
    return f"ray: started a private local Ray for this command ({time.time() - started_at:.1f} s)"


def private_here() -> bool:
    """Would ``connect`` start a private Ray on this machine (no cluster named, none kept)?"""
    return not os.environ.get("RAY_ADDRESS") and not settings.keeps_cluster()


def started_private() -> bool:
    """Is the Ray this process joined the private one it started for itself (``connect``)?"""
    return _private


def _join_lasting_cluster(ray: Any, options: dict[str, Any]) -> str:
    started_at = time.monotonic()
    state, started = _held.enter_context(local_cluster.claimed(log.say))
    ray_compat.use_auth_token(state.token_path)
    local_cluster.single_node_client()
    # The workers' processes are children of a Ray started by an earlier command: this
    # command's settings (threads, MLflow, Python path) reach them through the payload
    # (launch.py, local_cluster.worker_env); the cluster's address and Ray Train's settings are
    # in the cluster's own environment.
    ray.init(address=state.gcs_address, **options)
    local_cluster.joined.set()
    took = time.monotonic() - started_at
    if started:
        from trainforge.driver import cluster_footprint

        idle_min = local_cluster.idle_stop_s() / 60
        cost = cluster_footprint.cost_line(None)
        return (
            f"ray: started a local cluster at {state.gcs_address} ({took:.1f} s); later commands "
            f"reuse it, it stops after {idle_min:.0f} min unused or on `trainforge cluster stop`"
        ) + (f"\n{log.PREFIX} {cost}" if cost else "")
    return f"ray: connected to the local cluster at {state.gcs_address} ({took:.1f} s)"


REACH_TIMEOUT_S = 5.0
UNSET_HINT = "or unset RAY_ADDRESS to run on this machine"


def refuse_unreachable(address: str) -> None:
    """One line, before anything starts, for a RAY_ADDRESS nothing answers at: Ray itself waits
    for such a GCS without end, printing only its own warnings once a minute."""
    if address in ("auto", "local"):  # Ray finds (or starts) the cluster itself
        return
    if address.startswith(("http://", "https://")):
        raise RecipeError(
            f"RAY_ADDRESS={address} is a dashboard address (what `trainforge submit` and `ray job "
            f"submit` take); `trainforge train` joins a cluster by its head's GCS address "
            f"(HOST:6379), {UNSET_HINT}"
        )
    target = address.rpartition("://")[2]
    if not target.rpartition(":")[2].isdigit():
        raise RecipeError(
            f"RAY_ADDRESS={address}: expected HOST:PORT (the head's GCS), {UNSET_HINT}"
        )
    reason = no_listener(target)
    if reason:
        raise RecipeError(
            f"RAY_ADDRESS={address}: no Ray cluster answers there ({reason}); check that its "
            f"head runs (`ray status --address {target}`), {UNSET_HINT}"
        )


def no_listener(address: str) -> str | None:
    """Why nothing takes a connection at ``[scheme://]HOST:PORT[/…]`` within seconds (refused,
    no route, no answer), else None; None too where the address names no port."""
    host, _, port = address.rpartition("://")[2].split("/")[0].rpartition(":")
    if not port.isdigit():
        return None
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), REACH_TIMEOUT_S).close()
    except TimeoutError:
        return f"no answer in {REACH_TIMEOUT_S:g} s"
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


def _init_pinned(ray: Any, address: str, own: str, options: dict[str, Any]) -> None:
    if own == "auto" or "://" in own:  # not a GCS address: nothing to pin
        ray.init(address=address, **options)
        return
    try:
        ray.init(address=address, runtime_env={"env_vars": {"RAY_ADDRESS": own}}, **options)
    except ValueError as exc:  # a submitted job's runtime env already sets RAY_ADDRESS
        if not ray_compat.is_runtime_env_conflict(exc):
            raise
        ray.init(address=address, **options)


def storage_root(run: RunSection) -> str:
    """Absolute storage path (Ray workers run elsewhere); URIs such as s3:// pass through."""
    return storage.absolute(run.storage_path)
