"""Command line: argument parsing, recipes found by path or shipped name, and the optional
packages a workload needs checked; each subcommand hands off to its module."""

from __future__ import annotations

import argparse
import importlib.util
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from trainforge import __version__, log
from trainforge.errors import RecipeError, UserCodeError
from trainforge.resources import default_runtime_env, describe, find_recipe, shipped_recipes

if TYPE_CHECKING:  # the CLI imports the config (and OmegaConf) only for commands that load one
    from trainforge.config import Recipe

RECIPE_HELP = "a recipe YAML file, or a shipped recipe's name such as cnn/digits_simple_cnn"
# workload.kind → the module it needs that a plain install lacks, and the extra that brings it
OPTIONAL_MODULES = {"sbi": ("sbi", "sbi")}


def parser() -> argparse.ArgumentParser:
    root = argparse.ArgumentParser(
        prog="trainforge", description="Distributed training from YAML recipes (Ray Train + DDP)."
    )
    root.add_argument("--version", action="version", version=f"trainforge {__version__}")
    commands = root.add_subparsers(dest="command", required=True)
    # -q / -v on every command (`trainforge train -q recipe.yaml`)
    common = argparse.ArgumentParser(add_help=False)
    loudness = common.add_mutually_exclusive_group()
    loudness.add_argument(
        "-q", "--quiet", action="store_true", help="only warnings, errors and the outcome"
    )
    loudness.add_argument(
        "-v", "--verbose", action="store_true", help="also Ray's and MLflow's own log lines"
    )

    def add(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        return commands.add_parser(name, parents=[common], **kwargs)

    for name, text in (
        ("train", "train a recipe on a local Ray instance or the cluster in RAY_ADDRESS"),
        ("validate", "check a recipe and print it fully resolved"),
        ("simulate", "run only the simulation stage of an SBI recipe (cached, resumable)"),
    ):
        command = add(name, help=text, description=text)
        command.add_argument("recipe", help=RECIPE_HELP)
        command.add_argument(
            "overrides", nargs="*", metavar="key=value", help="dotted overrides, e.g. train.lr=0.01"
        )
    sweep = add(
        "sweep",
        help="search a recipe's settings (sweep.space) on Ray Tune: every trial a whole run",
        description="Trials of the recipe with settings drawn from its sweep.space (Optuna's "
        "TPE or random), stopped early by ASHA on sweep.metric; each trial is the run "
        "`trainforge train` makes, named <run.name>-t<index>, its MLflow run nested under "
        "the sweep's. The same command again resumes the sweep.",
    )
    sweep.add_argument("recipe", help=RECIPE_HELP)
    sweep.add_argument(
        "overrides", nargs="*", metavar="key=value",
        help="dotted overrides, e.g. sweep.space.train.lr='loguniform(1e-4, 1e-1)'",
    )  # fmt: skip
    sweep.add_argument("--trials", type=_at_least_one, help="how many trials (sweep.trials)")
    submit = add(
        "submit",
        help="submit a recipe to a Ray cluster with `ray job submit` (run name = submission id)",
    )
    submit.add_argument(
        "recipe",
        help="a recipe YAML file inside the project (the current directory) or a "
        "shipped recipe's name (`trainforge recipes`)",
    )
    submit.add_argument("overrides", nargs="*", metavar="key=value")
    submit.add_argument("--address", help="Ray dashboard address (default: $RAY_ADDRESS)")
    submit.add_argument(
        "--runtime-env", help="runtime_env YAML (default: the one shipped with trainforge)"
    )
    submit.add_argument("--no-wait", action="store_true", help="return once submitted")
    submit.add_argument(
        "--no-working-dir",
        action="store_true",
        help="ship nothing: the cluster's image already holds the project",
    )
    submit.add_argument(
        "--trust-cluster",
        action="store_true",
        help="skip the checks that the run is kept (an absolute run.storage_path, an MLflow "
        "store set and answering from this machine): for a cluster whose nodes set "
        "MLFLOW_TRACKING_URI themselves or reach a server this machine does not",
    )
    cluster = add(
        "cluster",
        help="the local Ray cluster that trainforge keeps between commands",
        description="Local commands (no RAY_ADDRESS) share one Ray cluster that the first of "
        "them starts; it stops itself after TRAINFORGE_CLUSTER_IDLE_S seconds unused "
        "(default 1800). TRAINFORGE_WORKERS=own keeps none: each command trains on processes "
        "of its own, or starts a private Ray where it needs one, which ends with it.",
    )
    cluster.add_argument(
        "action", choices=("start", "status", "stop"),
        help="start it now (else the first local command does), show it and its warm workers, "
        "or stop it",
    )  # fmt: skip
    cluster.add_argument("--num-cpus", type=_at_least_one, metavar="N",
                         help="CPUs Ray may schedule, for `start` (default: all)")  # fmt: skip
    add(
        "recipes",
        help="list the recipes shipped with trainforge (use a name wherever a recipe path goes)",
    )
    sync = add(
        "tracking-sync",
        help="send what a run kept locally while MLflow was unreachable",
        description="Replay RUN_DIR/tracking-spool.jsonl into the MLflow run (found by run name).",
    )
    sync.add_argument("run_dir", help="the run's folder: <run.storage_path>/<run.name>")
    sync.add_argument("--tracking-uri", help="send to this server instead of the recorded one")
    ensemble = add(
        "ensemble",
        help="combine SBI posteriors trained apart into one (sbi's EnsemblePosterior)",
        description="Write the posteriors of finished SBI runs of one task (e.g. one recipe "
        "with several run.seed values) as one file: their equal-weight mixture, which "
        "load_posterior opens as sbi's EnsemblePosterior.",
    )
    ensemble.add_argument(
        "members", nargs="+", help="run folders (their posterior.pt) or posterior files"
    )
    ensemble.add_argument("--out", required=True, help="the ensemble's file, e.g. ensemble.pt")
    ui = add("ui", help="open the MLflow UI on the runs of a tracking store")
    ui.add_argument("--tracking-uri", help="default: $MLFLOW_TRACKING_URI or sqlite:///mlflow.db")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument(
        "--experiment", default="trainforge", help="whose runs to show (default: trainforge)"
    )
    return root


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    """The command line parsed, overrides also after an option (``trainforge sweep r.yaml
    --trials 8 train.lr=…``), which argparse leaves unparsed once an option follows the
    first of them."""
    commands = parser()
    args, extra = commands.parse_known_args(argv)
    overrides = all("=" in e and not e.startswith("-") for e in extra)
    if extra and overrides and isinstance(getattr(args, "overrides", None), list):
        args.overrides += extra
    elif extra:
        commands.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _at_least_one(text: str) -> int:
    """A count of CPUs: a whole number, 1 or more (a cluster of 0 CPUs would run nothing)."""
    try:
        number = int(text)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"a whole number of at least 1, not {text!r}")
    return number


def main(argv: list[str] | None = None) -> int:
    if argv is not None:  # called in a process that began earlier: the command begins now
        log.STARTED_AT = time.time()
    args = _arguments(argv)
    set_loudness(args.verbose - args.quiet)
    if args.command in ("train", "simulate", "sweep"):  # the MLflow run's description quotes it
        from trainforge.tracking.driver import invoked_as

        invoked_as(["trainforge", *(sys.argv[1:] if argv is None else argv)])
    try:
        if args.command == "tracking-sync":
            return _tracking_sync(args.run_dir, args.tracking_uri)
        if args.command == "ui":
            return _ui(args.tracking_uri, args.port, args.experiment)
        if args.command == "recipes":
            return _list_recipes()
        if args.command == "ensemble":
            return _ensemble(args.members, args.out)
        if args.command == "cluster":
            return _cluster(args.action, args.num_cpus)
        if args.command == "submit":
            from pathlib import Path

            from trainforge.driver import submit

            # No check of optional modules here: the job runs on the cluster's install, whose
            # own `trainforge train` checks them before any worker starts.
            env_file = Path(args.runtime_env) if args.runtime_env else default_runtime_env()
            return submit.submit(
                args.recipe,
                args.overrides,
                args.address,
                env_file,
                wait=not args.no_wait,
                ship=not args.no_working_dir,
                trust_cluster=args.trust_cluster,
            )
        from trainforge import config

        if args.command == "sweep" and args.trials is not None:
            args.overrides.append(f"sweep.trials={args.trials}")
        cfg = _load(args.recipe, args.overrides)
        if args.command == "sweep":
            return _sweep(cfg, args.recipe, args.overrides)
        if args.command == "validate":
            _warn_if_train_would_refuse(cfg)  # raises on the user's own code: print nothing
            print(config.to_yaml(cfg), end="")
            print(f"# global batch: {config.global_batch(cfg)}", file=sys.stderr)
            return 0
        check_optional_modules(cfg.workload.kind)
        from trainforge.driver import launch
        from trainforge.workloads import spec_for

        if args.command == "simulate":
            return launch.simulate(cfg)
        ensembles = spec_for(cfg.workload.kind).ensembles
        if ensembles is not None and ensembles.members(cfg.workload) > 1:  # members, combined
            from trainforge.driver import ensemble_run

            return ensemble_run.train(cfg, args.recipe, args.overrides)
        rounds = spec_for(cfg.workload.kind).rounds
        if rounds is not None and rounds.count(cfg.workload) > 1:  # sequential rounds
            from trainforge.driver import rounds_run

            return rounds_run.train(cfg, args.recipe, args.overrides)
        return launch.train(cfg).exit_code
    except RecipeError as exc:
        log.refuse(_one_line(str(exc)))
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM before or between runs' own handling
        stopped = "terminated" if isinstance(exc, Terminated) else "interrupted"
        log.error(f"{stopped}; nothing was lost: a run resumes from its last checkpoint")
        return 143 if isinstance(exc, Terminated) else 130


def _sweep(cfg: Recipe, recipe: str, overrides: list[str]) -> int:
    """`trainforge sweep`: the space checked against the recipe before anything starts."""
    from trainforge.driver import sweep

    check_optional_modules(cfg.workload.kind)
    path, _ = find_recipe(recipe)
    dimensions = sweep.check(cfg, path, overrides)
    return sweep.sweep(cfg, recipe, overrides, dimensions)


def _one_line(text: str) -> str:
    """A refusal stays one line when it quotes the user's text as typed: a key or a path may
    hold a newline or other control characters, shown escaped."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


class Terminated(KeyboardInterrupt):
    """SIGTERM (a scheduler, `kill`), raised in the main thread like a Ctrl-C: the command
    stops the same way, with one line, instead of dying mid-write or printing Ray's stacks."""


def _on_sigterm(signum: int, frame: object) -> None:
    raise Terminated()


def _stop_again_if_dropped(unraisable: Any) -> None:
    """``sys.unraisablehook``: a Ctrl-C or SIGTERM whose exception Python had to drop is sent
    again. A signal's handler runs in whatever Python code the main thread is in; when that is
    a hook Python calls from C and cannot raise through (``os.register_at_fork``'s, run while
    Ray starts its processes; a ``__del__``), the interrupt was printed as "Exception ignored"
    and the command went on as if never stopped. The signal is sent again from another thread
    a moment later, so its handler runs once the main thread is back in ordinary code."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        signum = signal.SIGTERM if isinstance(unraisable.exc_value, Terminated) else signal.SIGINT
        threading.Timer(0.01, os.kill, (os.getpid(), signum)).start()
        return
    sys.__unraisablehook__(unraisable)


def handle_stops() -> None:
    """SIGTERM stops the command like a Ctrl-C, and neither is ever dropped."""
    signal.signal(signal.SIGTERM, _on_sigterm)
    sys.unraisablehook = _stop_again_if_dropped


def run() -> None:
    """The `trainforge` script and `python -m trainforge`: main, then a prompt exit.

    After a run everything that matters is written (MLflow run ended, checkpoints persisted,
    output flushed); what remains is the interpreter tearing down torch, Ray's threads and
    MLflow's clients, ~1.5 s on a 2-core machine that every command paid. Ray is left first
    (so the driver's job ends cleanly on the cluster), then the process exits directly."""
    handle_stops()
    try:
        code = main()
        sys.stdout.flush()  # a listing's print()s, buffered in a pipe
    except BrokenPipeError:  # ... whose reader went away (`trainforge recipes | head -3`)
        log.silence(sys.stdout)
        code = 141  # what a shell reports for a command ended by SIGPIPE
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def set_loudness(level: int) -> None:
    """-q / -v for this command: trainforge's own lines, and whether Ray's and MLflow's
    INFO lines reach the console (MLflow reads its level when it is imported)."""
    log.set_verbosity(level)
    if level <= 0:
        os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")
    if not sys.stdout.isatty():  # Ray's "(RayTrainWorker pid=…)" prefixes (-v) without colour
        os.environ.setdefault("RAY_COLOR_PREFIX", "0")


def _tracking_sync(run_dir: str, tracking_uri: str | None) -> int:
    from trainforge.tracking.client import configure_client_env
    from trainforge.tracking.spool import described, replay, spool_path

    path = spool_path(run_dir)
    if not path.parent.is_dir():
        raise RecipeError(f"no run folder {run_dir} (give the folder a run wrote, runs/NAME)")
    if not path.is_file():
        raise RecipeError(f"nothing to sync: {path} does not exist (everything was sent)")
    configure_client_env()
    try:
        counts = replay(path, tracking_uri)
    except Exception as exc:
        log.error(f"MLflow still unreachable, {path} kept: {exc}")
        return 1
    log.say(f"synced {path}: {described(counts)}")
    return 0


def _ensemble(members: list[str], out: str) -> int:
    from pathlib import Path

    from trainforge.workloads import spec_for

    ensembles = spec_for("sbi").ensembles  # posteriors: the family whose runs combine
    assert ensembles is not None
    held = ensembles.combine([Path(m) for m in members], Path(out))
    models = ", ".join(f"{model} ×{n}" for model, n in held["models"].items())
    log.say(f"ensemble of {held['members']} posteriors of {held['prior']} ({models}) → {out}")
    log.say("open it with trainforge.workloads.sbi.load_posterior: sbi's EnsemblePosterior, "
            "equal weights")  # fmt: skip
    return 0


def _cluster(action: str, num_cpus: int | None) -> int:
    from trainforge.driver import local_cluster

    if num_cpus is not None and action != "start":  # else silently not what was asked
        raise RecipeError(f"--num-cpus is for `trainforge cluster start`, not `{action}`")

    if action == "status":
        return _cluster_status()
    from trainforge.driver import background

    # A command that ran without the cluster starts it as it ends (background.py): a stop
    # ends that start first, else it could bring a cluster up after the stop; so does a start
    # asked for other CPUs than that start's.
    starting = local_cluster.background_start_running()
    if action == "stop":
        if starting:
            log.say("a background start of the local cluster is under way: ending it first")
            background.stop()
        stopped = local_cluster.stop()
        log.say("local cluster stopped" if stopped else "no local cluster was running")
        return 0
    if starting and num_cpus is None:
        log.say("a background start of the local cluster is under way: waiting for its cluster")
        came_up = local_cluster.start()  # waits for that start's own; starts one if it made none
        log.say(f"local cluster at {came_up.gcs_address}, dashboard {came_up.dashboard_url}")
        return 0
    if starting and num_cpus is not None:
        log.say(f"a background start of the local cluster is under way: ending it first, to "
                f"start one with {log.counted(num_cpus, 'CPU', 'CPUs')}")  # fmt: skip
        background.stop()
        local_cluster.stop()
    found = local_cluster.read_state()
    if found is not None and local_cluster.why_stale(found) is None:
        return _cluster_runs_already(found, num_cpus)
    if found is not None:
        local_cluster.stop(found)
    state = local_cluster.start(num_cpus=num_cpus)
    log.say(f"local cluster started at {state.gcs_address}, dashboard {state.dashboard_url}")
    return 0


def _cluster_status() -> int:
    """`trainforge cluster status`: 0 when a cluster runs, else 1 (with what there is)."""
    from trainforge.driver import local_cluster

    with local_cluster.looked_at() as running:  # it cannot stop itself while we look
        # a command that ran without the cluster starts it as it ends (background.py)
        starting = local_cluster.background_start_running()
        log_path = local_cluster.background_log_path()
        if running is None and starting:
            log.say(f"the local cluster is being started in the background, for later "
                    f"commands (its log: {log_path})")  # fmt: skip
            return 1
        if running is None:
            log.say(_no_cluster())
            return 1
        log.say(f"local cluster at {running.gcs_address}, dashboard "
                f"{running.dashboard_url}, supervisor pid {running.supervisor_pid}, "
                f"Ray {running.ray_version}")  # fmt: skip
        cpus, gpus, workers = _cluster_view(running)
        log.say(_cluster_memory(running.supervisor_pid))
    log.say(f"resources: {log.counted(cpus, 'CPU', 'CPUs')}, {log.counted(gpus, 'GPU', 'GPUs')}")
    if starting:
        log.say(f"a background start is still readying warm workers (its log: {log_path})")
    kinds = (("worker", "workers"), ("tracker", "trackers"), ("simulator", "simulators"))
    for kind, what in kinds:
        lines = [line for line in workers if line.startswith(f"{kind}-")]
        log.say(f"warm {what}: {len(lines) or 'none'}")
        for line in lines:
            log.say(f"  {line}")
    return 0


def _cluster_memory(supervisor_pid: int) -> str:
    from trainforge.driver import cluster_footprint

    found = cluster_footprint.processes(supervisor_pid)
    held = cluster_footprint.gigabytes(cluster_footprint.memory_pss(found))
    return (f"memory: {held} (PSS, summed over its "
            f"{log.counted(len(found), 'process', 'processes')})")  # fmt: skip


def _no_cluster() -> str:
    """What status says where no cluster can be used: nothing, or one whose supervisor died
    and left its Ray running."""
    from trainforge.driver import local_cluster, orphans

    found = local_cluster.read_state()
    left = orphans.of_cluster(found.gcs_address) if found is not None else []
    if found is None or not left:
        return "no local cluster is running; the next local command starts one"
    why = local_cluster.why_stale(found) or "it does not answer"
    return (
        f"the local cluster at {found.gcs_address} is unusable ({why}), but "
        f"{log.counted(len(left), 'process', 'processes')} of its Ray still run "
        "(pids "
        + " ".join(map(str, sorted(left)[:8]))
        + (" …" if len(left) > 8 else "")
        + "): `trainforge cluster stop` ends them; the next local command replaces it"
    )


def _cluster_runs_already(state: Any, num_cpus: int | None) -> int:
    """`trainforge cluster start` found the cluster running: fine, unless it was asked for
    other CPUs than the cluster has (then 1: a cluster's CPUs are fixed at its start)."""
    from trainforge.driver import local_cluster

    if num_cpus is None:
        log.say(f"a local cluster runs already at {state.gcs_address}")
        return 0
    with local_cluster.looked_at() as running:  # it cannot stop itself while we look
        cpus = _cluster_view(running)[0] if running is not None else None
    if cpus is None:  # it stopped itself, idle, just before the look: start the one asked for
        return _cluster("start", num_cpus)
    if cpus == num_cpus:
        cpus_text = log.counted(num_cpus, "CPU", "CPUs")
        log.say(f"a local cluster runs already at {state.gcs_address}, with {cpus_text}")
        return 0
    log.say(f"a local cluster runs already at {state.gcs_address} with "
            f"{log.counted(cpus, 'CPU', 'CPUs')}, not the {num_cpus} asked for: "
            f"`trainforge cluster stop` first to start one with {num_cpus}")  # fmt: skip
    return 1


def _cluster_view(state: Any) -> tuple[int, int, list[str]]:
    """The lasting cluster's CPUs and GPUs, and its warm workers, trackers and simulators
    (``driver/warm_pool.py``), a line each."""
    import logging

    import ray

    from trainforge import ray_compat
    from trainforge.driver import local_cluster, warm_pool

    ray_compat.use_auth_token(state.token_path)
    local_cluster.single_node_client()
    ray.init(address=state.gcs_address, logging_level=logging.WARNING, log_to_driver=False)
    try:
        total = ray.cluster_resources()
        return int(total.get("CPU", 0)), int(total.get("GPU", 0)), warm_pool.describe()
    finally:
        ray.shutdown()


def _ui(tracking_uri: str | None, port: int, experiment: str) -> int:
    import socket
    import subprocess

    from trainforge.tracking.client import reachable, redact, resolve_uri, runs_view, uri_problem

    uri = resolve_uri(tracking_uri)
    problem = uri_problem(uri)
    if problem:
        raise RecipeError(f"--tracking-uri: {redact(uri)!r} {problem}")
    if uri.startswith(("http://", "https://")):
        if not reachable(uri, timeout_s=5.0):
            raise RecipeError(
                f"--tracking-uri: no MLflow server answers at {redact(uri)} (5 s); check that "
                "it is running and the host, port and http/https"
            )
        served = redact(uri).rstrip("/")
        log.say(f"that store is served already: open {runs_view(uri, experiment, served)}")
        return 0
    with socket.socket() as probe:  # `mlflow ui` on a taken port fails after a page of logs
        if probe.connect_ex(("127.0.0.1", port)) == 0:
            raise RecipeError(f"--port: {port} is taken on 127.0.0.1; pass another --port")
    shown = runs_view(uri, experiment, f"http://127.0.0.1:{port}")  # the runs, not GenAI's
    log.say(f"MLflow UI for {redact(uri)} at {shown}")
    # One server process, not MLflow's default of four: one person's UI on a local store
    # answers as fast, and it starts in half the time on a busy 2-core machine (/health after
    # 22-24 s against 42-44 s with two other processes running).
    command = ["mlflow", "ui", "--backend-store-uri", uri, "--host", "127.0.0.1",
               "--port", str(port), "--workers", "1"]  # fmt: skip
    # Nor MLflow's job runner (its GenAI scorers and prompt optimisation; runs need none of
    # it): eight more processes, 2,356 MB against 498, 30.7 CPU-seconds against 8.6 in the
    # first 25 s on this project's 2-core machine (bench/mlflow_ui_start.py).
    env = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false", **os.environ}  # the user's word wins
    return subprocess.call(command, env=env)


def _load(recipe: str, overrides: list[str]) -> Recipe:
    """The recipe (a path or a shipped recipe's name), loaded and checked."""
    from trainforge import config

    path, _ = find_recipe(recipe)
    try:
        return config.load(path, overrides)
    except ModuleNotFoundError as exc:
        # a check that imports an optional package (an SBI embedding net's): the same one line
        kind = next((k for k, (m, _) in OPTIONAL_MODULES.items() if exc.name == m), None)
        if kind is None:
            raise
        raise _missing_module(kind) from None


def check_optional_modules(kind: str) -> None:
    """A workload whose library is an optional extra: one clear line instead of an ImportError
    from deep inside a worker. Asks for the module's spec only: importing sbi costs ~1.4 s."""
    if kind in OPTIONAL_MODULES and importlib.util.find_spec(OPTIONAL_MODULES[kind][0]) is None:
        raise _missing_module(kind)


def _missing_module(kind: str) -> RecipeError:
    module, extra = OPTIONAL_MODULES[kind]
    return RecipeError(
        f"workload.kind: {kind} needs the {module} package: pip install 'trainforge[{extra}]'"
    )


def _list_recipes() -> int:
    recipes = shipped_recipes()
    width = max(map(len, recipes), default=0)
    for name, path in recipes.items():
        print(f"{name:<{width}}  {describe(path)}".rstrip())
    return 0


def _warn_if_train_would_refuse(cfg: Recipe) -> None:
    """`validate` checks the recipe; what this machine lacks (data, an optional package) is a
    note, since the recipe may be meant for another machine. The user's own code (an SBI
    simulator: imported and run on two prior draws) failing is an error: it fails everywhere."""
    from trainforge.workloads import check_workload_data

    try:
        check_optional_modules(cfg.workload.kind)
        check_workload_data(cfg.workload)
    except UserCodeError:
        raise
    except RecipeError as exc:
        print(f"# note: `train` would refuse on this machine: {exc}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
