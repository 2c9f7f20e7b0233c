"""How a command's workers are started: one interface (``base.WorkerGroup``), one failure policy
(``base.run_with_restarts``), three implementations, and ``choose``, which picks one:

- ``own.OwnWorkers``: processes of the command, on this machine, where no cluster is to be used;
- ``warm.WarmWorkers``: the lasting local cluster's warm workers, kept between commands;
- ``ray_train.RayTrainWorkers``: Ray Train's worker group, on any cluster (joined by address, a
  submitted job, KubeRay, SLURM).

Nothing is imported here at the package's import: Ray Train's controller imports this package
(for ``ray_train_backend``) and must stay light.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from trainforge.config import Recipe
    from trainforge.driver.workers.base import WorkerGroup


def choose(cfg: Recipe, storage_root: str) -> WorkerGroup:
    """The worker group of this command, with the recipe's workers resolved against what its
    place offers: the command's own processes where it has no cluster to use (decided before
    Ray is imported), else — on the cluster it joins, or starts — the lasting local cluster's
    warm workers, else Ray Train's worker group. ``TRAINFORGE_WORKERS`` narrows the choice."""
    from trainforge import config, log
    from trainforge.driver import warm_pool
    from trainforge.driver.cluster import connect
    from trainforge.driver.local_cluster import on_lasting_cluster
    from trainforge.driver.workers import own

    if own.unavailable(cfg, storage_root) is None:  # no cluster runs: none is waited for
        log.say(own.phase_line(cfg))
        return own.OwnWorkers(config.resolve_workers(cfg, own.resources(), "this machine"))
    import ray

    connect()
    cfg = config.resolve_workers(cfg, ray.cluster_resources())
    if warm_pool.unavailable(cfg, storage_root, on_lasting_cluster()) is None:
        from trainforge.driver.workers.warm import WarmWorkers

        return WarmWorkers(cfg)
    from trainforge.driver.workers.ray_train import RayTrainWorkers

    return RayTrainWorkers(cfg)
