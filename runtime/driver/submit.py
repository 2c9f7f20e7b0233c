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
- the entrypoint, ``python -m trainforge train …``, reserves no CPU or GPU: the driver only
  coordinates, and a reserved GPU would starve a training worker.

The cluster must have trainforge installed (the image of deploy/docker does): trainforge itself
does not travel in the working_dir, which holds the user's project, not site-packages.
The recipe is validated before anything is submitted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]  # PyYAML ships no type stubs

from trainforge import config, log
from trainforge.errors import RecipeError
from trainforge.log import first_line
from trainforge.resources import default_runtime_env, find_recipe
from trainforge.tracking.driver import GIT_COMMIT_ENV, git_commit

DEFAULT_RUNTIME_ENV = default_runtime_env()
# Ray uploads the working_dir whole (and refuses one over its size limit): leave out what a
# project keeps beside its code — data, runs, tracking stores, caches, virtual environments.
EXCLUDES = [
    ".git", ".device", ".whl", "data", "runs", "mlruns", "mlartifacts", "mlflow.db",
    "trainforge-spool", "**/__pycache__", ".pytest_cache", ".ruff_cache", "*.egg-info",
    ".venv", "venv",
]  # fmt: skip
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
CONNECT_TIMEOUT_S = 10.0


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
        env["excludes"] = sorted(set(env.get("excludes", [])) | set(EXCLUDES))
    env_vars = {str(k): str(v) for k, v in (env.get("env_vars") or {}).items()}
    if commit:
        env_vars[GIT_COMMIT_ENV] = commit
    env["env_vars"] = env_vars
    return env


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
) -> int:
    """Submit from the project folder (the current directory), which ships as the working_dir.

    ``ship=False`` sends no working_dir: for clusters whose image already holds the project
    (the container of deploy/docker); a recipe file is then named by its absolute path."""
    project = Path.cwd().resolve()
    path, name = find_recipe(recipe)
    cfg = config.load(path, overrides)  # refuse a bad recipe before touching the cluster
    recipe_arg = entrypoint_recipe(path, name, project if ship else None)
    runtime_env = build_runtime_env(
        runtime_env_file, git_commit_of(project), project if ship else None
    )
    env = dict(os.environ)
    if (Path.home() / ".ray" / "auth_token").is_file():
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


def job_client(address: str | None, timeout_s: float = CONNECT_TIMEOUT_S) -> Any:
    """The cluster's job API, or one line saying what to check — within ``timeout_s``: Ray
    retries an unreachable head (a stale local cluster file) for about 40 s, then raises from
    deep inside its RPC layer."""
    from ray.job_submission import JobSubmissionClient

    answer: list[Any] = []

    def connect() -> None:
        try:
            answer.append(JobSubmissionClient(address))
        except Exception as exc:
            answer.append(exc)

    # A daemon thread: Ray's connection attempt cannot be cancelled, only abandoned. While it
    # retries, Ray's C++ core logs a line every few seconds onto fd 2: kept aside, and shown
    # only if the connection works after all.
    with tempfile.TemporaryFile() as aside:
        with _stderr_into(aside.fileno()):
            threading.Thread(target=connect, name="trainforge-job-client", daemon=True).start()
            deadline = time.monotonic() + timeout_s
            while not answer and time.monotonic() < deadline:
                time.sleep(0.05)
        if not answer:
            raise unreachable(address, f"no answer in {timeout_s:g} s")
        if isinstance(answer[0], Exception):
            raise unreachable(address, f"{type(answer[0]).__name__}: {first_line(answer[0])}")
        aside.seek(0)
        sys.stderr.write(aside.read().decode(errors="replace"))
    return answer[0]


@contextlib.contextmanager
def _stderr_into(fd: int) -> Iterator[None]:
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(fd, 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


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
        fix = "`ray status` (a cluster that stopped leaves a stale address) or pass --address"
    return RecipeError(f"cannot reach {where} ({reason}); check {fix}")


def job_status(submission_id: str, address: str | None) -> str | None:
    """The job's status (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED) or None if unknown."""
    client = job_client(address)
    try:
        return str(client.get_job_status(submission_id).value)
    except RuntimeError:  # no job with this id
        return None


def _clear_finished_job(submission_id: str, address: str | None, env: dict[str, str]) -> None:
    """A finished job with this id blocks resubmission; a running one is an error."""
    os.environ.update({k: v for k, v in env.items() if k == "RAY_AUTH_MODE"})
    state = job_status(submission_id, address)
    if state in ("RUNNING", "PENDING"):
        raise RecipeError(f"run.name: job {submission_id!r} is {state} on the cluster already")
    if state in TERMINAL:
        job_client(address).delete_job(submission_id)
        log.say(f"resubmitting {submission_id!r} (previous job {state}); it resumes")
