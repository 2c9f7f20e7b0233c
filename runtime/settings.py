"""Every ``TRAINFORGE_*`` environment setting, declared once here with its default and meaning.
No other module names one: each reads its setting through this module, and the docs' table of
settings is generated from ``SETTINGS`` (``table``)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from trainforge.errors import not_one_of


@dataclass(frozen=True)
class Setting:
    name: str
    default: str
    meaning: str
    choices: tuple[str, ...] = ()
    set_by_trainforge: bool = False
    """Set by trainforge for the processes it starts (a submitted job, an ensemble's members),
    not by a user."""

    def get(self) -> str:
        """The value in this process's environment, else the default; one of ``choices``
        (else RecipeError, before anything starts)."""
        value = os.environ.get(self.name, "").strip() or self.default
        if self.choices and value not in self.choices:
            raise not_one_of(self.name, value, self.choices)
        return value

    def seconds(self) -> float:
        value = self.get()
        try:
            return float(value)
        except ValueError:
            raise not_one_of(self.name, value, ["a number of seconds"]) from None

    def is_set(self) -> bool:
        return bool(os.environ.get(self.name, "").strip())


HOME = Setting(
    "TRAINFORGE_HOME", "~/.cache/trainforge",
    "trainforge's folder on this machine for what outlives a command: the lasting local "
    "cluster, the sbibm wheel, the empty MLflow store (each user's own).",
)  # fmt: skip
WORKERS = Setting(
    "TRAINFORGE_WORKERS", "auto",
    "Where a local command's workers run. `auto`: processes of the command where no local "
    "cluster runs (the lasting cluster then starts in the background for later commands), the "
    "lasting cluster's warm workers where it runs, Ray Train's worker group on a cluster named "
    "by RAY_ADDRESS. `own`: processes of the command, and nothing outlives it (a private Ray "
    "only for a data stage that needs one). `warm`: the lasting cluster's warm workers, the "
    "cluster started first where none runs. `ray-train`: Ray Train's worker group on the "
    "lasting cluster (no warm workers or simulators). `private`: Ray Train's worker group on a "
    "private Ray that ends with the command.",
    choices=("auto", "own", "warm", "ray-train", "private"),
)  # fmt: skip
WARM_IDLE_S = Setting(
    "TRAINFORGE_WARM_IDLE_S", "600",
    "Seconds a warm worker or warm simulator waits unused before it ends (its memory back to "
    "the machine).",
)  # fmt: skip
CLUSTER_IDLE_S = Setting(
    "TRAINFORGE_CLUSTER_IDLE_S", "1800",
    "Seconds the lasting local cluster waits with no command using it before it stops.",
)  # fmt: skip
WORKER_PLUGINS = Setting(
    "TRAINFORGE_WORKER_PLUGINS", "",
    "Modules (comma-separated) that every worker imports before its loop; each one's "
    "`install(trainer, checkpointer)` may wrap the loop's parts. The tests inject faults so.",
)  # fmt: skip
SBIBM = Setting(
    "TRAINFORGE_SBIBM", "",
    "sbibm 1.1.0's wheel (or its unpacked folder), where SBI evaluation reads the benchmark "
    "tasks' observations and reference posteriors; else the cache, else PyPI.",
)  # fmt: skip
USER = Setting(
    "TRAINFORGE_USER", "",
    "Who submitted a job (`trainforge submit`): the MLflow run's user, where the job itself "
    "runs as the cluster's.",
    set_by_trainforge=True,
)  # fmt: skip
GIT_COMMIT = Setting(
    "TRAINFORGE_GIT_COMMIT", "",
    "The submitted tree's git commit (`trainforge submit`), which ships without `.git`.",
    set_by_trainforge=True,
)  # fmt: skip
PARENT_RUN = Setting(
    "TRAINFORGE_MLFLOW_PARENT_RUN_ID", "",
    "An ensemble member's or a sweep trial's MLflow parent run: its run nests under the "
    "ensemble's or the sweep's.",
    set_by_trainforge=True,
)  # fmt: skip

PRELOAD = Setting(
    "TRAINFORGE_PRELOAD", "",
    "Modules (comma-separated) a Ray Train worker process imports on a thread from its start: "
    "what the run needs beyond torch and the loop, set by the command for its workers.",
    set_by_trainforge=True,
)  # fmt: skip
PROGRESS_EVENTS = Setting(
    "TRAINFORGE_PROGRESS_EVENTS", "",
    "Set (to 1) by a sweep for its trials' commands: rank 0's progress is printed as the marked "
    "JSON lines it comes as, from which the sweep reads each epoch's metrics.",
    set_by_trainforge=True,
)  # fmt: skip

SETTINGS = (HOME, WORKERS, WARM_IDLE_S, CLUSTER_IDLE_S, WORKER_PLUGINS, SBIBM, USER, GIT_COMMIT,
            PARENT_RUN, PRELOAD, PROGRESS_EVENTS)  # fmt: skip


def home() -> Path:
    return Path(os.path.expanduser(HOME.get()))


def workers() -> str:
    return WORKERS.get()


def keeps_cluster() -> bool:
    """Whether local commands use (and start) the lasting local cluster."""
    return workers() not in ("own", "private")


def warm_pool() -> bool:
    """Whether commands on the lasting local cluster use its warm workers and simulators."""
    return workers() in ("auto", "warm")


def own_processes() -> bool:
    """Whether a local command with no cluster to use trains on processes of its own."""
    return workers() in ("auto", "own")


def worker_plugins() -> tuple[str, ...]:
    return tuple(name.strip() for name in WORKER_PLUGINS.get().split(",") if name.strip())


def preload() -> tuple[str, ...]:
    return tuple(name.strip() for name in PRELOAD.get().split(",") if name.strip())


def table() -> str:
    """The settings as a Markdown table, for the docs."""
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    for setting in SETTINGS:
        default = f"`{setting.default}`" if setting.default else "(unset)"
        meaning = setting.meaning + (" Set by trainforge." if setting.set_by_trainforge else "")
        rows.append(f"| `{setting.name}` | {default} | {meaning} |")
    return "\n".join(rows) + "\n"
