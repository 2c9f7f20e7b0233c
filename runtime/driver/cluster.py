"""The Ray cluster a run uses: joining it (or starting a local one), and where runs are stored.
Whether it can host the recipe's workers is decided by ``trainforge.config.resolve``."""

from __future__ import annotations

import os
import socket
from typing import Any

from trainforge import ray_compat, storage
from trainforge.config.schema import RunSection


def connect(local_only: bool = False, **init_options: Any) -> None:
    """Join the cluster in RAY_ADDRESS (as under `ray job submit`), else start a local Ray.

    Every process of the job is given its own cluster's address (RAY_ADDRESS in the job's
    runtime env). Ray Train's placement-group cleaner, a detached actor, asks the State API
    whether the run's controller lives; without RAY_ADDRESS that API asks the cluster named in
    /tmp/ray/ray_current_cluster (the last `ray start` on the machine). Another live cluster
    there has no such controller, and the cleaner removes the run's placement group: a healthy
    run is killed. A dead one makes each query wait ~40 s for its GCS, and the end of every run
    waited 12 s for the cleaner to stop (measured on this project's CPU). A local Ray therefore
    gets a known GCS port.
    """
    import ray

    if ray.is_initialized():
        return
    options = {"log_to_driver": True, "dashboard_host": "127.0.0.1", **init_options}
    address = None if local_only else os.environ.get("RAY_ADDRESS")
    if address:
        _init_pinned(ray, address, address, options)
        return
    # "local": a new instance even when a `ray start` cluster runs on this machine (a bare
    # ray.init() would join that one). The local dashboard stays on loopback.
    port = os.environ.get(GCS_PORT_ENV) or str(_free_port())
    previous = os.environ.get(GCS_PORT_ENV)
    os.environ[GCS_PORT_ENV] = port  # read by Ray when it starts the local GCS
    try:
        _init_pinned(ray, "local", f"127.0.0.1:{port}", options)
    finally:
        if previous is None:
            del os.environ[GCS_PORT_ENV]


GCS_PORT_ENV = "RAY_GCS_SERVER_PORT"


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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def storage_root(run: RunSection) -> str:
    """Absolute storage path (Ray workers run elsewhere); URIs such as s3:// pass through."""
    return storage.absolute(run.storage_path)
