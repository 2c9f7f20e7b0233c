"""A rehearsal: new warm workers' first run, made in the background before any command needs
them, so the next command finds workers that have run once.

Why: a warm worker's first run pays what its later runs do not: the first optimizer step, the
first checkpoint, MLflow's model logging and figures on rank 0, on a GPU the first CUDA-graph
capture and cuDNN's autotuning (the command after a cold one, on the
workers the background started, had 5.4 s of overhead on this project's 2-core CPU against
3.9 s on workers that had run once; on one H200 its first step came after 3.3-4.5 s against
2.2-2.4 s). The background start after a cold command (``own_workers.main``) therefore runs
the command's own recipe for a few steps on them, through the command's own path
(``run.run_workers``), in a temporary folder with a temporary MLflow store, both deleted
afterwards: nothing of it reaches the user's runs or MLflow, and no worker plugin of the
command's (a test's fault) is installed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from trainforge import config
from trainforge.config import Recipe
from trainforge.config.schema import cuda_graph_blocker
from trainforge.workloads import spec_for

STEPS = 2
"""Optimizer steps of a rehearsal: the first pays what every first step pays, the second
runs as later ones do."""
GRAPH_WARMUP_STEPS = (3, 11)
"""Where the steps may be CUDA graphs: the eager steps before the capture (one GPU, DDP), as
``worker.step`` takes them, added so that the rehearsal captures the graph and replays it.
(This module does not import torch, which ``worker.step`` does.)"""


def steps(cfg: Recipe) -> int:
    """A rehearsal's optimizer steps for the resolved recipe ``cfg``."""
    if cuda_graph_blocker(cfg) is not None or cfg.precision.cuda_graphs == "false":
        return STEPS
    return STEPS + GRAPH_WARMUP_STEPS[cfg.scaling.num_workers > 1]


def recipe(cfg: Recipe, folder: Path) -> Recipe:
    """The command's resolved recipe (workers, device, data as it ran), cut to a rehearsal:
    ``steps(cfg)`` steps each logged, its run and MLflow store in ``folder``, the workload's final
    evaluation at its cheapest (``WorkloadSpec.rehearsal``)."""
    cut = {
        "run": {"name": "rehearsal", "storage_path": str(folder), "max_failures": 0},
        "checkpoint": {"resume": False},
        "train": {"max_steps": steps(cfg), "log_every_steps": 1},
        "tracking": {"tracking_uri": f"sqlite:///{folder}/mlflow.db", "profile_steps": 0},
        "workload": spec_for(cfg.workload.kind).rehearsal,
    }
    merged = OmegaConf.merge(config.to_container(cfg), cut)
    assert isinstance(merged, DictConfig)
    return config.build(merged)


def rehearse(cfg: Recipe, ahead: dict[str, Any]) -> int | None:
    """Run the rehearsal of ``cfg`` on the warm workers just started (``ahead``, by name:
    ``worker-<slot>``); its exit status (0: they ran), None where they are not all new.

    Their slots are not claimed: a command that claims one meanwhile waits for the
    rehearsal's end (a worker serves one call at a time) and then takes rehearsed workers,
    where claimed slots would send it to other slots and new workers."""
    from trainforge.driver import run
    from trainforge.driver.workers.warm import WarmWorkers

    slots = sorted(int(name.rsplit("-", 1)[1]) for name in ahead if name.startswith("worker-"))
    if len(slots) != cfg.scaling.num_workers:
        return None
    with tempfile.TemporaryDirectory(prefix="trainforge-rehearsal-") as folder:
        short = recipe(cfg, Path(folder))
        payload = run.worker_payload(short, folder).but(plugins=())
        with WarmWorkers(short, ahead, slots) as group:
            return run.run_workers(short, payload, group).exit_code
