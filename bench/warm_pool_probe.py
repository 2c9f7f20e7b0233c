"""Issue 12's proposal, measured: what a run would cost if its worker processes outlived it.

Today every `trainforge train` asks Ray Train for a new controller actor, a placement group and
new worker processes, which import torch and Ray Train and join a new process group, and end
with the run. This probe keeps a pool of worker actors alive in the lasting local cluster
(detached, named, with torch and the loop imported once) and runs the same loop
(``trainforge.worker.trainer.run``) in them: each run is a fresh driver process that loads
and resolves the recipe, creates the MLflow run as the real command does, finds the pool,
joins a new gloo process group on a free port, runs the loop (checkpoints to the run folder
through ``FolderReporter``) and closes the MLflow run. It is a probe for the design, not a
runtime path: no restarts after a failure, no Ray Train checkpoint registry.

One invocation, one machine, in this order: the real command twice against a lasting cluster
(the first starts it), then the pool: one run that creates the actors, then ``--repeats`` runs
that find them; the phase marks are ``bench/startup.py``'s, from the lines each run prints.

    python bench/warm_pool_probe.py --out probe.json cnn/digits_simple_cnn train.epochs=2
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from startup import stop_cluster, timed_command

NAMESPACE = "trainforge-pool-probe"


def pool_run(recipe: str, overrides: list[str], workers: int) -> None:
    """One run through the pool (this process is its driver)."""
    started = time.time()
    import ray

    from trainforge import config, log
    from trainforge.driver import local_cluster
    from trainforge.driver.cluster import connect, storage_root
    from trainforge.driver.mlflow_run import spool_file
    from trainforge.resources import find_recipe
    from trainforge.tracking import driver as tracking
    from trainforge.worker.payload import WorkerPayload

    cfg = config.load(find_recipe(recipe)[0], overrides)
    root = storage_root(cfg.run)
    connect()
    cfg = config.resolve(cfg, ray.cluster_resources(), root)
    recipe_container, recipe_yaml = config.to_container(cfg), config.to_yaml(cfg)
    mlflow_started = time.time()
    handle = tracking.start_run(
        cfg.tracking, cfg.run.name, recipe_container, recipe_yaml, str(spool_file(cfg, root))
    )
    run_dir = f"{root}/{cfg.run.name}"
    payload = WorkerPayload(recipe_container, run_dir, "probe", env=local_cluster.worker_env(),
                            mlflow=handle.for_workers())  # fmt: skip
    log.phase("mlflow", f"run {handle.run_id}", mlflow_started)
    requested = time.time()
    pool = [pool_worker(i) for i in range(workers)]
    port = local_cluster.free_port()
    metrics = ray.get([w.run.remote(payload, i, workers, port) for i, w in enumerate(pool)])[0]
    log.phase("pool", f"{workers} workers ran the loop", requested)
    tracking.finish_run(handle, "FINISHED", None)
    log.say(
        f"run '{cfg.run.name}' finished in {time.time() - started:.1f} s: {len(metrics)} metrics"
    )
    sys.stdout.flush()
    os._exit(0)  # as the CLI does: nothing left to tear down that matters


def pool_worker(index: int) -> Any:
    """The pool's worker ``index``: found by name, or created (detached) with the loop imported."""
    import ray

    @ray.remote(num_cpus=1, lifetime="detached", name=f"pool-{index}", namespace=NAMESPACE)
    class PoolWorker:
        def __init__(self) -> None:
            os.environ.setdefault("OMP_NUM_THREADS", "1")
            import torch  # noqa: F401 - paid once per pool, not once per run

            import trainforge.worker.trainer  # noqa: F401

        def run(self, payload: Any, rank: int, world: int, port: int) -> dict:
            import torch
            import torch.distributed as dist

            from trainforge.checkpoint import FolderReporter
            from trainforge.distributed import WorkerContext
            from trainforge.worker import environment
            from trainforge.worker.trainer import run

            environment.apply(payload.env)
            store = dist.TCPStore("127.0.0.1", port, world, is_master=rank == 0)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
            try:
                ctx = WorkerContext(rank, rank, world, 0, torch.device("cpu"))
                reporter = FolderReporter(Path(payload.run_dir))
                reporter.root.mkdir(parents=True, exist_ok=True)
                run(payload, ctx, reporter)
                return reporter.reports[-1] if reporter.reports else {}
            finally:
                dist.destroy_process_group()

    try:
        return ray.get_actor(f"pool-{index}", namespace=NAMESPACE)
    except ValueError:
        return PoolWorker.remote()  # type: ignore[attr-defined]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("recipe", nargs="?", default="cnn/digits_simple_cnn")
    parser.add_argument("overrides", nargs="*", default=["train.epochs=2"])
    parser.add_argument("--out", default="warm_pool_probe.json")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--pool-run", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    overrides = [*args.overrides, "train.log_every_steps=1", f"scaling.num_workers={args.workers}"]
    if args.pool_run:
        pool_run(args.recipe, overrides, args.workers)
        return
    work = Path(tempfile.mkdtemp(prefix="tf-pool-probe-"))
    env = {**os.environ, "TRAINFORGE_HOME": str(work / "home"), "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    env.pop("TRAINFORGE_KEEP_CLUSTER", None)
    runs: dict[str, list[dict[str, Any]]] = {"command_cold": [], "command_warm": [], "pool": []}
    stop_cluster(env)
    for i in range(1 + args.repeats):
        command = [sys.executable, "-m", "trainforge", "train", args.recipe, f"run.name=cmd{i}",
                   *overrides]  # fmt: skip
        runs["command_cold" if i == 0 else "command_warm"].append(timed_command(command, env, work))
        print("command", json.dumps(runs["command_warm" if i else "command_cold"][-1]), flush=True)
    for i in range(1 + args.repeats):  # the first creates the pool
        command = [sys.executable, __file__, "--pool-run", f"--workers={args.workers}",
                   args.recipe, *args.overrides, f"run.name=pool{i}"]  # fmt: skip
        runs["pool"].append(timed_command(command, env, work))
        print("pool", json.dumps(runs["pool"][-1]), flush=True)
    stop_cluster(env)  # ends the pool's actors with the cluster
    numbers = ("wall_s", "first_step", "overhead_s", "loop_end_took_s", "workers_took_s")
    medians = {
        mode: {
            key: statistics.median(r[key] for r in results if key in r)
            for key in numbers
            if any(key in r for r in results)
        }
        for mode, results in {
            "command_warm": runs["command_warm"],
            "pool_first": runs["pool"][:1],
            "pool_warm": runs["pool"][1:],
        }.items()
    }
    report = {"recipe": args.recipe, "overrides": overrides, "cpus": os.cpu_count(),
              "medians": medians, "runs": runs}  # fmt: skip
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(json.dumps(medians, indent=1))


if __name__ == "__main__":
    main()
