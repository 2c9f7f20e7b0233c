"""Every place trainforge relies on Ray behaviour that is not public API, each with why, so
a Ray upgrade has one file to check (written against Ray 2.60)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

CHECKPOINT_DIR_GLOB = "checkpoint_*"
"""How Ray Train names the checkpoint folders it persists under ``storage_path/run.name``.
A worker that dies right after reporting can leave a persisted checkpoint that the controller
never registered; the loop scans for these so a saved checkpoint is never lost."""

HEALTH_CHECK_INTERVAL_ENV = "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S"


def poll_controller_fast() -> None:
    """``ray.train.report`` blocks once the controller's one-slot result queue is full, until
    the controller's next poll (2 s by default): poll faster so short epochs don't wait on it."""
    os.environ.setdefault(HEALTH_CHECK_INTERVAL_ENV, "0.2")


COLLECTIVE_TIMEOUT_ENV = "RAY_TRAIN_COLLECTIVE_TIMEOUT_S"


def time_out_report_barriers(seconds: float) -> None:
    """``ray.train.report`` is a barrier of Ray Train's own, not a torch collective: the
    process-group timeout does not reach it, and by default it waits forever (logging a warning
    a minute) for a rank that never reports. Ray Train reads its timeout from this variable in
    the driver and passes it on to its controller and workers (``ENV_VARS_TO_PROPAGATE``); the
    rank that gave up raises ``BroadcastCollectiveTimeoutError``."""
    os.environ[COLLECTIVE_TIMEOUT_ENV] = str(seconds)


def report_timeout_ranks(error: BaseException) -> list[int] | None:
    """The ranks that never reached ``ray.train.report`` when ``error`` (a worker's failure)
    is Ray Train's report barrier timing out, else None. Its class is internal
    (``ray.train.v2._internal.exceptions``); the ranks are its ``_missing_ranks``."""
    from ray.train.v2._internal.exceptions import BroadcastCollectiveTimeoutError

    if not isinstance(error, BroadcastCollectiveTimeoutError):
        return None
    return sorted(getattr(error, "_missing_ranks", None) or [])


def session_dir() -> str | None:
    """The session folder of the Ray this process started or joined (``/tmp/ray/session_…``),
    where every process of that Ray writes its logs; None when not connected. Ray has no public
    API for it: ``ray._private.worker._global_node`` is the node this driver runs on."""
    import ray._private.worker

    node = ray._private.worker._global_node
    return None if node is None else str(node.get_session_dir_path())


KV_NAMESPACE = "trainforge"


def kv_put(key: str, value: bytes) -> None:
    """A value for every process of this Ray to read, on any node: Ray's internal key-value
    store in its GCS (``ray.experimental.internal_kv``, private). Used to hand Ray Train's
    workers what the command makes while they start (``driver/mlflow_handover.py``)."""
    from ray.experimental import internal_kv

    internal_kv._internal_kv_put(key, value, overwrite=True, namespace=KV_NAMESPACE)


def kv_get(key: str) -> bytes | None:
    from ray.experimental import internal_kv

    value = internal_kv._internal_kv_get(key, namespace=KV_NAMESPACE)
    return None if value is None else bytes(value)


def kv_del(key: str) -> None:
    from ray.experimental import internal_kv

    internal_kv._internal_kv_del(key, namespace=KV_NAMESPACE)


def setup_hook_env(hook: str) -> dict[str, str]:
    """The environment that makes a Ray worker process call ``hook`` (``module.function``) at
    its start. A runtime env's ``worker_process_setup_hook`` becomes this variable only where a
    driver submits the actor (``upload_worker_process_setup_hook_if_needed``); Ray Train's
    controller, which starts the workers, passes the workers' runtime env on unconverted, so
    the variable that Ray's worker entry (``default_worker.py``) reads is set directly."""
    from ray._private.ray_constants import WORKER_PROCESS_SETUP_HOOK_ENV_VAR

    return {WORKER_PROCESS_SETUP_HOOK_ENV_VAR: hook}


def is_runtime_env_conflict(exc: ValueError) -> bool:
    """``ray.init(runtime_env=…)`` inside a submitted job whose runtime env already sets the same
    variable raises a ValueError about failing to merge them; Ray has no type for it."""
    return "merge" in str(exc)


def trainer_class() -> type:
    # Not ray.train.torch's TorchTrainer: that module imports torch in this process and in Ray
    # Train's controller (trainforge/process_group.py says why that matters).
    from ray.train.v2._internal.callbacks import DatasetsCallback, WorkingDirectorySetupCallback
    from ray.train.v2._internal.callbacks.placement_group_callback import (
        PlacementGroupCleanerCallback,
    )
    from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

    class Trainer(DataParallelTrainer):
        """Ray Train's trainer that remembers a Ctrl-C: Ray Train's own SIGINT handler aborts
        the run gracefully and fit() then ends like a failure; the run must be recorded as
        KILLED. Relies on the private hooks ``_register_sigint_handler`` and
        ``_create_default_callbacks``."""

        interrupted = False

        def _create_default_callbacks(self) -> list[Any]:
            """Ray Train's callbacks less three. Two each start one more Ray process per run,
            which a 2-core machine starts one after another before the first worker: the
            dataset manager (this runtime gives Ray Train no Ray Datasets; the callback would
            also import Ray Data in every worker), and the detached placement-group cleaner,
            for a controller that dies while its driver lives on (every trainforge command is
            a Ray job of its own, whose placement groups Ray removes when it ends). The third
            moves each worker into a new folder per run (the session's ``artifacts/<run>``),
            which nothing here reads or writes: a worker stays where Ray starts it (a
            submitted job's working directory), as the other groups' stay in the command's.
            The CUDA driver's JIT cache spares a process the kernels of cuDNN's autotuning
            only where an earlier one compiled them in the same working directory: in a new
            folder every run, each run's first step on one H100 came 5.3-6.5 s after its
            set-up, in the folder Ray starts workers in 1.5-1.7 s."""
            dropped = (
                DatasetsCallback,
                PlacementGroupCleanerCallback,
                WorkingDirectorySetupCallback,
            )
            callbacks = super()._create_default_callbacks()  # type: ignore[misc]  # private
            return [c for c in callbacks if not isinstance(c, dropped)]

        def _initialize_and_run_controller(self, **controller_init_kwargs: Any) -> Any:
            policy = controller_init_kwargs["scaling_policy"]
            controller_init_kwargs["scaling_policy"] = without_autoscaling_coordinator(policy)
            return super()._initialize_and_run_controller(**controller_init_kwargs)  # type: ignore[misc]  # private

        def fit(self) -> Any:
            previous = signal.getsignal(signal.SIGINT)
            try:
                return super().fit()
            finally:
                # Ray Train leaves its handler installed after fit(): a closure over the run
                # controller's actor handle. A later fork of this process whose child replaces
                # the SIGINT handler (a multiprocessing Manager's does) drops that handle in
                # the child, whose Ray then reports the actor out of scope over this process's
                # own GCS connection: this process's next GCS call never got its answer (seen
                # in CI). Put back, the handler releases the handle here, where it belongs.
                if previous is not None and threading.current_thread() is threading.main_thread():
                    signal.signal(signal.SIGINT, previous)

        def _register_sigint_handler(self, controller: Any) -> None:
            super()._register_sigint_handler(controller)  # type: ignore[misc]  # private
            ray_handler = signal.getsignal(signal.SIGINT)

            def on_sigint(signum: int, frame: Any) -> None:
                self.interrupted = True
                if callable(ray_handler):
                    ray_handler(signum, frame)

            signal.signal(signal.SIGINT, on_sigint)

    return Trainer


def without_autoscaling_coordinator(policy: Any) -> Any:
    """Ray Train's fixed scaling policy (``policy``, what Ray would use) less its requests to
    Ray Data's autoscaling coordinator. At its controller's start Ray Train 2.60 creates that
    detached actor (a process of its own, importing Ray Data, pandas and pyarrow) and waits up
    to 5 s for it to take a resource request before it starts any worker, in the first run on
    every new cluster (every private Ray; a KubeRay RayJob's or a SLURM allocation's cluster):
    on one H200 host 1.0 s of the worker group's start, the whole 5 s where Python has no
    bytecode to import from. The
    coordinator tells Ray Data's executors what Train holds, so that they do not count on it
    (ray-project/ray#61703); trainforge runs no Ray Data, and a cluster's autoscaler still sees
    the run's placement group waiting, as it always did. Any other policy (elastic training) is
    returned as it is. Relies on ``FixedScalingPolicy`` (``ray.train.v2._internal``) sending its
    requests from ``after_controller_start`` and ``_maybe_send_resource_request`` only."""
    from ray.train.v2._internal.execution.scaling_policy.fixed import FixedScalingPolicy

    if type(policy) is not FixedScalingPolicy:
        return policy

    class Uncoordinated(FixedScalingPolicy):
        def after_controller_start(self, train_run_context: Any) -> None:
            pass  # no coordinator client: cancelling at shutdown is then a no-op in Ray Train

        def _maybe_send_resource_request(self) -> None:
            pass

    return Uncoordinated(policy.scaling_config)


def worker_errors(exc: BaseException) -> list[BaseException]:
    """The workers' own exceptions behind a failed ``fit()``, lowest rank first."""
    return list(worker_failures(exc).values())


def worker_failures(exc: BaseException) -> dict[int, BaseException]:
    """Rank → the exception that worker raised, behind a failed ``fit()``, lowest rank first.

    Ray Train V2 raises ``WorkerGroupError`` with ``worker_failures`` (rank → exception); each
    is Ray's ``RayTaskError``, whose ``cause`` is the exception the worker raised, or, for a
    worker whose process died, Ray Train's health-check error, whose ``health_check_failure``
    is Ray's ``ActorDiedError``."""
    failures = getattr(exc, "worker_failures", None) or {}
    found = {}
    for rank in sorted(failures):
        error = getattr(failures[rank], "cause", None) or failures[rank]
        found[rank] = getattr(error, "health_check_failure", None) or error
    return found


def use_auth_token(token_path: str) -> None:
    """Talk to a cluster with token authentication, whose token is in ``token_path``.

    Ray reads RAY_AUTH_MODE and the token once per process, when ray is imported; a driver
    that imports Ray before it knows which cluster it joins (every trainforge command) must
    set them and make Ray read them again: ``Config.initialize("")`` re-reads the mode (as
    Ray's own ``_enable_token_auth`` does) and the C++ token loader drops its cached token.
    """
    os.environ["RAY_AUTH_TOKEN_PATH"] = token_path
    os.environ.pop("RAY_AUTH_TOKEN", None)  # it would win over the file
    use_token_mode()


def token_on_this_machine() -> bool:
    """Whether a Ray auth token is where Ray looks for one (``RAY_AUTH_TOKEN``,
    ``RAY_AUTH_TOKEN_PATH``, ``~/.ray/auth_token``). `ray start` on Ray 2.60 makes clusters that
    want it, and writes it there; a driver sends it only in token mode (``RAY_AUTH_MODE``):
    without, Ray retries its connection for ~20 s, then says it could not connect."""
    from pathlib import Path

    path = os.environ.get("RAY_AUTH_TOKEN_PATH") or str(Path.home() / ".ray" / "auth_token")
    return bool(os.environ.get("RAY_AUTH_TOKEN")) or Path(path).is_file()


def use_token_mode() -> None:
    """Token authentication, said explicitly: Ray then starts a local cluster with it without
    its "Token authentication is enabled…" warning (the mode is re-read as above)."""
    os.environ["RAY_AUTH_MODE"] = "token"
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()


def replace_worker_log_printer(handler: Any) -> None:
    """Route the worker output Ray relays to the driver through ``handler`` instead of Ray's
    printer. Ray registers its printer under the name "ray_print_logs" on a private
    dispatcher; its log-level settings do not reach Ray Train's per-report lines or the core's
    C++ lines."""
    from ray._private import worker

    dispatcher = worker.global_worker_stdstream_dispatcher
    dispatcher.remove_handler("ray_print_logs")
    dispatcher.add_handler("ray_print_logs", handler)


def _ray_printer() -> Callable[[dict[str, Any]], None]:
    import functools

    from ray._private import worker

    ignore_prefix = worker._should_ignore_worker_log_prefix(worker.global_worker)
    return functools.partial(worker.print_to_stdstream, ignore_prefix=ignore_prefix)


def restore_worker_log_printer(each_line: Callable[[str], str] | None = None) -> None:
    """Ray's own printer back (as ray.init registers it), for a -v run after another run in
    the same process; every relayed line passed through ``each_line`` first, where given."""
    printer = _ray_printer()
    if each_line is None:
        replace_worker_log_printer(printer)
        return
    replace_worker_log_printer(
        lambda data: printer({**data, "lines": [each_line(line) for line in data.get("lines", [])]})
    )


# What Ray's GCS, raylet and workers say when the metrics agent came up late (a busy host: seen
# with four commands starting at once on 4 cores). Only Ray's own metrics are lost, which
# trainforge does not use; ray-project/ray#59665 asks for a switch, and there is none.
_LATE_METRICS_AGENT = re.compile(r"connection to the (event\+)?metrics exporter agent")


def is_late_metrics_agent(line: str) -> bool:
    return _LATE_METRICS_AGENT.search(line) is not None


def without_late_metrics_agent(
    printer: Callable[[dict[str, Any]], None],
) -> Callable[[dict[str, Any]], None]:
    """``printer`` (a handler of Ray's relayed log batches) less the late-metrics-agent lines."""

    def handler(data: dict[str, Any]) -> None:
        lines = [line for line in data.get("lines", []) if not is_late_metrics_agent(line)]
        if lines:
            printer({**data, "lines": lines})

    return handler


def quiet_ray_printer() -> None:
    """Ray's own printer, less its late-metrics-agent lines: what the driver shows from
    ``ray.init`` until a run's console takes over (the SBI simulation stage comes first)."""
    replace_worker_log_printer(without_late_metrics_agent(_ray_printer()))


ADDON_MODULES = ("pydantic", "starlette", "pyarrow")
"""The packages whose types Ray's serialization add-ons register custom serializers for."""


def skip_unused_serializer_addons() -> None:
    """A process's first Ray call builds its serialization context, and with it Ray's add-ons
    (``ray.util.serialization_addons.apply``): serializers for pydantic's, starlette's and
    pyarrow's types, importing those packages to register them (0.18-0.24 s on this project's
    CPU; on one H200 host no change was seen). A driver
    that never imported them cannot have their objects in what it sends; the add-ons run as
    before once any of them is imported. Relies on the context calling the module's ``apply``
    by attribute (``ray._private.serialization``, Ray 2.60). Deserializing needs no
    registration: a custom serializer's result names its own rebuilding function."""
    from ray.util import serialization_addons

    every_addon = serialization_addons.apply
    if getattr(every_addon, "skips_unused", False):
        return

    def apply(context: Any) -> None:
        if any(name in sys.modules for name in ADDON_MODULES):
            every_addon(context)

    apply.skips_unused = True  # type: ignore[attr-defined]
    serialization_addons.apply = apply


@contextlib.contextmanager
def keeping_sigterm_handler() -> Iterator[None]:
    """``ray.init`` installs Ray core's own SIGTERM handler in the driver, which prints the
    process's stack through abseil and aborts: a driver with a Python handler of its own (the
    CLI's: stop with one line) gets it back afterwards."""
    previous = signal.getsignal(signal.SIGTERM)
    try:
        yield
    finally:
        if callable(previous) and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, previous)
