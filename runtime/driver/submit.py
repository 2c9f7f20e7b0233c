"""`trainforge submit`: a thin wrapper over `ray job submit` for a recipe.

- the run name is the submission id, so a job, its Ray Train run directory and its MLflow run
  share one identity (a resubmitted run resumes instead of forking);
- the user's project — the current directory — ships as the job's working_dir, without data,
  runs and caches: the entrypoint runs there, so the project's recipes and its own modules (a
  custom SBI simulator) are found as they are here;
- a recipe is a file inside the project (named relative to it) or a shipped recipe's name,
  which the cluster's own trainforge resolves;
- the runtime_env file (by default the one shipped with trainforge) carries the environment
  variables, plus the project's git commit captured here (the shipped tree has no .git);
- a job whose run would not be kept — a relative run folder or SQLite store, which land in
  the job's temporary working_dir, or no tracking store that answers — is refused before the
  cluster is asked anything (``submit_checks.py``);
- the entrypoint, ``python -m trainforge train …``, reserves no CPU or GPU: the driver only
  coordinates, and a reserved GPU would starve a training worker.

The cluster must have trainforge installed (the image of deploy/docker does): trainforge itself
does not travel in the working_dir, which holds the user's project, not site-packages.
The recipe is validated before anything is submitted.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]  # PyYAML ships no type stubs

from trainforge import config, log, ray_compat, settings
from trainforge.driver.cluster import no_listener
from trainforge.driver.submit_checks import check_kept
from trainforge.errors import RecipeError
from trainforge.resources import default_runtime_env, find_recipe
from trainforge.tracking.driver import git_commit, submitter

DEFAULT_RUNTIME_ENV = default_runtime_env()
# Ray uploads the working_dir whole (and refuses one over its size limit): leave out what a
# project keeps beside its code — data, runs, tracking stores, caches, virtual environments.
EXCLUDES = [
    ".git", ".device", ".whl", "data", "runs", "mlruns", "mlartifacts", "mlflow.db",
    "trainforge-spool", "**/__pycache__", ".pytest_cache", ".ruff_cache", "*.egg-info",
    ".venv", "venv",
]  # fmt: skip
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
CONNECT_TIMEOUT_S = 15.0  # Python and Ray start in the probe, then it connects


def build_runtime_env(
    runtime_env_file: Path | None, commit: str | None, project: Path | None
) -> dict[str, Any]:
    """``project``: the folder to ship as the working_dir, or None to ship nothing."""
    env: dict[str, Any] = {}
    if runtime_env_file is not None:
        if not runtime_env_file.is_file():
            raise RecipeError(f"--runtime-env: {runtime_env_file} does not exist")
        env = yaml.safe_load(runtime_env_file.read_text()) or {}
        if not isinstance(env, dict):
            raise RecipeError(f"--runtime-env: {runtime_env_file} must be a mapping")
    if project is not None:
        env.setdefault("working_dir", str(project))
        excludes = set(env.get("excludes", [])) | set(EXCLUDES) | set(environments_in(project))
        env["excludes"] = sorted(excludes)
    env_vars = {str(k): str(v) for k, v in (env.get("env_vars") or {}).items()}
    if commit:
        env_vars[settings.GIT_COMMIT.name] = commit
    env_vars.setdefault(settings.USER.name, submitter())  # the MLflow run's user: who submitted it
    env["env_vars"] = env_vars
    return env


def environments_in(project: Path) -> list[str]:
    """The project's top-level folders that are Python environments, whatever their names (a
    venv's ``pyvenv.cfg``, a conda environment's ``conda-meta``), as excludes anchored at the
    project's root. The cluster has an environment of its own, and a venv in the upload makes
    it gigabytes: Ray zips it all, then refuses it (over 100 MiB, after a minute of zipping)."""
    return [
        f"/{entry.name}"
        for entry in sorted(project.iterdir())
        if entry.is_dir() and not entry.is_symlink()
        and ((entry / "pyvenv.cfg").is_file() or (entry / "conda-meta").is_dir())
    ]  # fmt: skip


def command(
    recipe: str, overrides: list[str], address: str | None, runtime_env: dict[str, Any],
    submission_id: str, wait: bool,
) -> list[str]:  # fmt: skip
    args = ["ray", "job", "submit", "--submission-id", submission_id,
            "--runtime-env-json", json.dumps(runtime_env),
            "--entrypoint-num-cpus", "0", "--entrypoint-num-gpus", "0"]  # fmt: skip
    if address:
        args += ["--address", address]
    if not wait:
        args.append("--no-wait")
    # `python -m trainforge` works even where the console script is not on PATH
    return [*args, "--", "python", "-m", "trainforge", "train", recipe, *overrides]


def submit(
    recipe: str,
    overrides: list[str],
    address: str | None = None,
    runtime_env_file: Path | None = DEFAULT_RUNTIME_ENV,
    wait: bool = True,
    ship: bool = True,
    trust_cluster: bool = False,
) -> int:
    """Submit from the project folder (the current directory), which ships as the working_dir.

    ``ship=False`` sends no working_dir: for clusters whose image already holds the project
    (the container of deploy/docker); a recipe file is then named by its absolute path.
    ``trust_cluster``: skip the checks that the run is kept (``submit_checks.py``)."""
    project = Path.cwd().resolve()
    path, name = find_recipe(recipe)
    cfg = config.load(path, overrides)  # refuse a bad recipe before touching the cluster
    recipe_arg = entrypoint_recipe(path, name, project if ship else None)
    runtime_env = build_runtime_env(
        runtime_env_file, git_commit_of(project), project if ship else None
    )
    # before the cluster is asked anything: a run that would be lost is never submitted
    check_kept(cfg, runtime_env["env_vars"], runtime_env_file, ship, trust_cluster)
    env = dict(os.environ)
    if ray_compat.token_on_this_machine():
        env.setdefault("RAY_AUTH_MODE", "token")  # Ray ≥ 2.60 heads want the token
    _clear_finished_job(cfg.run.name, address, env)
    args = command(recipe_arg, overrides, address, runtime_env, cfg.run.name, wait)
    # say which folder is uploaded: it is the current directory, whatever it holds
    shipped = f"--working-dir {shlex.quote(str(project))}" if ship else "(no working_dir)"
    log.say(
        f"ray job submit --submission-id {shlex.quote(cfg.run.name)} {shipped} … -- "
        + shlex.join(args[args.index("--") + 1 :])
    )
    return subprocess.call(args, env=env)


def git_commit_of(root: Path) -> str | None:
    previous = Path.cwd()
    try:
        os.chdir(root)
        return git_commit()
    finally:
        os.chdir(previous)


def entrypoint_recipe(path: Path, name: str | None, project: Path | None) -> str:
    """How the job's entrypoint names the recipe.

    A shipped recipe goes by its name: the cluster's trainforge holds it (a path into this
    machine's site-packages would mean nothing there). A file ships with the project, where the
    entrypoint runs, so it is named relative to the project; without a working_dir (``project``
    None) the cluster's image holds it at the same absolute path.
    """
    if name is not None:
        return name
    resolved = path.resolve()
    if project is None:
        return str(resolved)
    try:
        return resolved.relative_to(project).as_posix()
    except ValueError:
        raise RecipeError(
            f"recipe {path}: must live inside the project ({project}, the current directory) to "
            "ship with the job; run `trainforge submit` from the project's folder, or name a "
            "shipped recipe (`trainforge recipes`)"
        ) from None


# Asks the cluster in a child process: Ray retries an unreachable head (a stale local cluster
# file) for ~40 s, logging from C++ onto stderr, and that attempt can only be stopped by ending
# the process that makes it.
_STATUS_PROBE = """
import json, sys
from ray.job_submission import JobSubmissionClient
try:
    client = JobSubmissionClient(sys.argv[1] or None)
except Exception as exc:
    text = str(exc).strip().splitlines()
    print(json.dumps({"error": type(exc).__name__ + (": " + text[0] if text else "")}))
    sys.exit(0)
try:
    print(json.dumps({"status": str(client.get_job_status(sys.argv[2]).value)}))
except RuntimeError:  # no job with this id
    print(json.dumps({"status": None}))
"""


def job_status(
    submission_id: str, address: str | None, timeout_s: float = CONNECT_TIMEOUT_S
) -> str | None:
    """The job's status (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED) or None if unknown;
    one RecipeError line saying what to check when the cluster does not answer in time."""
    where = address or os.environ.get("RAY_ADDRESS")
    refused = where and no_listener(where)  # seconds, not the probe's whole timeout
    if refused:
        raise unreachable(address, refused)
    probe = [sys.executable, "-c", _STATUS_PROBE, address or "", submission_id]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise unreachable(address, f"no answer in {timeout_s:g} s") from None
    lines = done.stdout.strip().splitlines()
    answer = json.loads(lines[-1]) if lines else {}
    if "status" not in answer:
        reason = answer.get("error") or (done.stderr.strip().splitlines() or ["no reply"])[-1]
        raise unreachable(address, reason[:300])
    return answer["status"]


def unreachable(address: str | None, reason: str) -> RecipeError:
    """The one line for a cluster that does not answer: which address was tried, what to check."""
    if address:
        where = f"the Ray cluster at {address}"
        fix = "--address (the head's dashboard, e.g. http://HEAD:8265)"
    elif os.environ.get("RAY_ADDRESS"):
        where = f"the Ray cluster at {os.environ['RAY_ADDRESS']}"
        fix = "$RAY_ADDRESS (the head's dashboard, e.g. http://HEAD:8265)"
    else:
        where = "the local Ray cluster"
        # not trainforge's own local cluster: a job's relative run folder and MLflow store would
        # land in the temporary copy of its working_dir
        fix = (
            "`ray status` (a cluster that stopped leaves a stale address) or pass --address; to "
            "run a recipe on this machine, `trainforge train` needs no Ray cluster"
        )
    return RecipeError(f"cannot reach {where} ({reason}); check {fix}")


def _clear_finished_job(submission_id: str, address: str | None, env: dict[str, str]) -> None:
    """A finished job with this id blocks resubmission; a running one is an error."""
    os.environ.update({k: v for k, v in env.items() if k == "RAY_AUTH_MODE"})
    state = job_status(submission_id, address)
    if state in ("RUNNING", "PENDING"):
        raise RecipeError(f"run.name: job {submission_id!r} is {state} on the cluster already")
    if state in TERMINAL:
        from ray.job_submission import JobSubmissionClient

        JobSubmissionClient(address).delete_job(submission_id)  # it answered just now
        log.say(f"resubmitting {submission_id!r} (previous job {state}); it resumes")
