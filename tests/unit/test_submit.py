"""`trainforge submit` up to the `ray job submit` command line: what ships, how the entrypoint
names the recipe, the runtime env and the git commit (no cluster: the call is captured)."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.git_repo import commit_all
from trainforge import cli, resources
from trainforge.driver import submit
from trainforge.errors import RecipeError
from trainforge.settings import GIT_COMMIT, USER

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "recipes" / "cnn" / "digits_simple_cnn.yaml"


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A user's project folder (not the checkout), the current directory, with its own recipe."""
    root = tmp_path / "project"
    (root / "recipes").mkdir(parents=True)
    shutil.copy(DIGITS, root / "recipes" / "mine.yaml")
    monkeypatch.chdir(root)
    return root


@pytest.fixture
def submitted(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """The `ray job submit` command lines `submit` would run."""
    calls: list[list[str]] = []
    monkeypatch.setattr(submit, "_clear_finished_job", lambda *args: None)
    monkeypatch.setattr(subprocess, "call", lambda args, env: calls.append(args) or 0)
    return calls


def _runtime_env(args: list[str]) -> dict:
    return json.loads(args[args.index("--runtime-env-json") + 1])


def _entrypoint(args: list[str]) -> list[str]:
    return args[args.index("--") + 1 :]


def test_the_current_directory_ships_as_the_working_dir(
    project: Path, submitted: list[list[str]]
) -> None:
    assert submit.submit("recipes/mine.yaml", ["train.epochs=1"]) == 0
    (args,) = submitted
    env = _runtime_env(args)
    assert env["working_dir"] == str(project)
    assert {".git", "runs", "mlflow.db", ".venv"} <= set(env["excludes"])
    assert _entrypoint(args) == [
        "python", "-m", "trainforge", "train", "recipes/mine.yaml", "train.epochs=1"
    ]  # fmt: skip
    assert args[args.index("--entrypoint-num-cpus") + 1] == "0"


def test_python_environments_in_the_project_stay_home_whatever_their_names(
    project: Path, submitted: list[list[str]]
) -> None:
    """A venv named otherwise than .venv/venv (a fresh clone's second one, a per-Python one)
    once made the upload 3.7 GB, which Ray refused with status 413 after zipping it."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(project / ".venv-py311")],
                   check=True)  # fmt: skip
    (project / "conda-env" / "conda-meta").mkdir(parents=True)
    (project / "src" / "env").mkdir(parents=True)  # code, which happens to be called env
    (project / "src" / "env" / "pyvenv.cfg").write_text("")  # deeper down: not looked at
    submit.submit("recipes/mine.yaml", [])
    excludes = set(_runtime_env(submitted[0])["excludes"])
    assert {"/.venv-py311", "/conda-env"} <= excludes
    assert not any("src" in pattern for pattern in excludes) and "/recipes" not in excludes


def test_a_recipe_file_by_absolute_path_is_named_relative_to_the_project(
    project: Path, submitted: list[list[str]]
) -> None:
    submit.submit(str(project / "recipes" / "mine.yaml"), [])
    assert _entrypoint(submitted[0])[4] == "recipes/mine.yaml"


def test_a_shipped_recipe_goes_by_its_name(project: Path, submitted: list[list[str]]) -> None:
    submit.submit("digits_simple_cnn", ["scaling.num_workers=1"])
    # the cluster's own trainforge resolves it: a path into this machine's site-packages
    # would mean nothing there
    assert _entrypoint(submitted[0])[4:] == ["cnn/digits_simple_cnn", "scaling.num_workers=1"]
    assert _runtime_env(submitted[0])["working_dir"] == str(project)


def test_a_recipe_outside_the_project_is_refused(
    project: Path, submitted: list[list[str]], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere.yaml"
    shutil.copy(DIGITS, elsewhere)
    with pytest.raises(RecipeError, match=r"must live inside the project .*current directory"):
        submit.submit(str(elsewhere), [])
    assert submitted == []


def test_without_working_dir_a_file_goes_by_its_absolute_path(
    project: Path, submitted: list[list[str]], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere.yaml"
    shutil.copy(DIGITS, elsewhere)
    submit.submit(str(elsewhere), [], ship=False)
    assert "working_dir" not in _runtime_env(submitted[0])
    assert _entrypoint(submitted[0])[4] == str(elsewhere)


def test_a_bad_recipe_is_refused_before_submitting(
    project: Path, submitted: list[list[str]]
) -> None:
    with pytest.raises(RecipeError, match=r"train\.lrr"):
        submit.submit("recipes/mine.yaml", ["train.lrr=1"])
    assert submitted == []


def test_default_runtime_env_is_the_packaged_one(project: Path, submitted: list[list[str]]) -> None:
    assert resources.default_runtime_env() == submit.DEFAULT_RUNTIME_ENV
    assert cli.main(["submit", "digits_simple_cnn"]) == 0
    packaged = submit.build_runtime_env(resources.default_runtime_env(), None, None)
    env = _runtime_env(submitted[0])
    assert packaged["env_vars"]  # the shipped file carries the cluster's environment variables
    assert packaged["env_vars"].items() <= env["env_vars"].items()


def test_the_git_commit_is_the_projects(project: Path, submitted: list[list[str]]) -> None:
    commit = commit_all(project, "mine")
    submit.submit("recipes/mine.yaml", [])
    assert _runtime_env(submitted[0])["env_vars"][GIT_COMMIT.name] == commit
    assert submit.git_commit_of(project) == commit


def test_runtime_env_file_errors(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="does not exist"):
        submit.build_runtime_env(tmp_path / "absent.yaml", None, None)
    (tmp_path / "list.yaml").write_text("- a\n")
    with pytest.raises(RecipeError, match="must be a mapping"):
        submit.build_runtime_env(tmp_path / "list.yaml", None, None)


# --- a cluster that does not answer: one line, in seconds ----------------------------------


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _submit_process(project: Path, *args: str, env: dict[str, str]) -> tuple[int, str, float]:
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "trainforge", "submit", "recipes/mine.yaml", *args],
        cwd=project, env={**os.environ, "OMP_NUM_THREADS": "1", **env},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return done.returncode, done.stderr, time.monotonic() - started


def test_an_unreachable_address_is_one_line_in_seconds(project: Path) -> None:
    address = f"http://127.0.0.1:{closed_port()}"
    code, err, took = _submit_process(project, "--address", address, env={})
    assert code == 2
    assert err == (
        f"trainforge: error: cannot reach the Ray cluster at {address} (Connection refused); "
        "check --address (the head's dashboard, e.g. http://HEAD:8265)\n"
    )
    assert took < 30  # not the status probe's 15 s: nothing listens there


def test_a_stale_local_cluster_file_is_one_line_within_the_timeout(
    project: Path, tmp_path: Path
) -> None:
    """What a stopped `ray start --head` leaves: Ray's record of the latest cluster, pointing
    at a head that is gone (Ray alone retries for ~40 s, then prints a page)."""
    ray_tmp = tmp_path / "raytmp"
    (ray_tmp / "ray").mkdir(parents=True)
    (ray_tmp / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{closed_port()}")
    env = {"RAY_TMPDIR": str(ray_tmp), "RAY_ADDRESS": ""}
    code, err, took = _submit_process(project, env=env)
    assert code == 2
    assert err.splitlines() == [err.strip()], err
    assert err.startswith("trainforge: error: cannot reach the local Ray cluster (")
    assert "check `ray status`" in err
    assert err.rstrip().endswith(
        "to run a recipe on this machine, `trainforge train` needs no Ray cluster"
    )
    assert took < submit.CONNECT_TIMEOUT_S + 15  # start-up and imports included


def test_the_job_carries_the_submitters_login_for_mlflow_user(
    project: Path, submitted: list[list[str]]
) -> None:
    submit.submit("recipes/mine.yaml", [])
    assert _runtime_env(submitted[0])["env_vars"][USER.name] == getpass.getuser()
