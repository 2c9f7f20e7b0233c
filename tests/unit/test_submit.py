"""`trainforge submit` up to the `ray job submit` command line: what ships, how the entrypoint
names the recipe, the runtime env and the git commit, and the refusal of a job whose run would
not be kept (no cluster: the call is captured, and a refusal comes before any connection)."""

from __future__ import annotations

import getpass
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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
    """A user's project folder (not the checkout), the current directory, with its own recipe,
    which keeps its run outside the job's working_dir (what submit asks for)."""
    root = tmp_path / "project"
    (root / "recipes").mkdir(parents=True)
    (root / "recipes" / "mine.yaml").write_text(kept_outside(tmp_path))
    monkeypatch.chdir(root)
    return root


def kept_outside(folder: Path) -> str:
    """The digits recipe with an absolute run folder and SQLite store (shared storage, on a
    cluster)."""
    run = "run:\n  name: digits-simple-cnn\n"
    assert run in DIGITS.read_text()
    return DIGITS.read_text().replace(
        run,
        f"{run}  storage_path: {folder / 'runs'}\n"
        f"tracking:\n  tracking_uri: sqlite:///{folder / 'mlflow.db'}\n",
    )


def safe(folder: Path) -> list[str]:
    """The same as overrides, for a shipped recipe."""
    return [f"run.storage_path={folder / 'runs'}",
            f"tracking.tracking_uri=sqlite:///{folder / 'mlflow.db'}"]  # fmt: skip


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


def test_a_shipped_recipe_goes_by_its_name(
    project: Path, submitted: list[list[str]], tmp_path: Path
) -> None:
    submit.submit("digits_simple_cnn", ["scaling.num_workers=1", *safe(tmp_path)])
    # the cluster's own trainforge resolves it: a path into this machine's site-packages
    # would mean nothing there
    assert _entrypoint(submitted[0])[4:] == [
        "cnn/digits_simple_cnn", "scaling.num_workers=1", *safe(tmp_path)
    ]  # fmt: skip
    assert _runtime_env(submitted[0])["working_dir"] == str(project)


def test_a_recipe_outside_the_project_is_refused(
    project: Path, submitted: list[list[str]], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere.yaml"
    shutil.copy(project / "recipes" / "mine.yaml", elsewhere)
    with pytest.raises(RecipeError, match=r"must live inside the project .*current directory"):
        submit.submit(str(elsewhere), [])
    assert submitted == []


def test_without_working_dir_a_file_goes_by_its_absolute_path(
    project: Path, submitted: list[list[str]], tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere.yaml"
    shutil.copy(project / "recipes" / "mine.yaml", elsewhere)
    submit.submit(str(elsewhere), [], ship=False)
    assert "working_dir" not in _runtime_env(submitted[0])
    assert _entrypoint(submitted[0])[4] == str(elsewhere)


def test_a_bad_recipe_is_refused_before_submitting(
    project: Path, submitted: list[list[str]]
) -> None:
    with pytest.raises(RecipeError, match=r"train\.lrr"):
        submit.submit("recipes/mine.yaml", ["train.lrr=1"])
    assert submitted == []


def test_default_runtime_env_is_the_packaged_one(
    project: Path, submitted: list[list[str]], tmp_path: Path
) -> None:
    assert resources.default_runtime_env() == submit.DEFAULT_RUNTIME_ENV
    assert cli.main(["submit", "digits_simple_cnn", *safe(tmp_path)]) == 0
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


# --- a run that would not be kept: refused before the cluster is asked anything -------------


@pytest.fixture
def cluster_never_asked(monkeypatch: pytest.MonkeyPatch) -> list[list[str]]:
    """Like ``submitted``, but asking the cluster fails the test: a refusal comes first."""

    def asked(*args: object) -> None:
        raise AssertionError("the cluster was asked before the refusal")

    calls: list[list[str]] = []
    monkeypatch.setattr(submit, "_clear_finished_job", asked)
    monkeypatch.setattr(subprocess, "call", lambda args, env: calls.append(args) or 0)
    return calls


@pytest.fixture
def health_server() -> Iterator[str]:
    """An address answering /health with 200, as an MLflow server does."""

    class Health(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.end_headers()
            self.wfile.write(b"OK")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Health)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_shipped_defaults_are_one_line_and_exit_2_before_any_connection(
    project: Path,
) -> None:
    """A shipped recipe with the shipped runtime env: ./runs and no MLflow store, both inside
    the job's temporary working_dir. The address is a closed port: a connection attempt would
    have said "cannot reach"."""
    done = subprocess.run(
        [sys.executable, "-m", "trainforge", "submit", "digits_simple_cnn",
         "--address", f"http://127.0.0.1:{closed_port()}"],
        cwd=project, env={**os.environ, "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "trainforge: error: run.storage_path './runs' is relative: the job's checkpoints would "
        "land in Ray's temporary copy of the working_dir, deleted with the job; set "
        "run.storage_path=/ABSOLUTE/PATH on storage the cluster's nodes share; no MLflow store "
        "is set for the job (tracking.tracking_uri, or MLFLOW_TRACKING_URI in --runtime-env): it "
        "would record into sqlite:///mlflow.db in Ray's temporary copy of the working_dir, "
        "deleted with the job; set tracking.tracking_uri to an MLflow server the cluster's nodes "
        "reach (http://HOST:5000) or sqlite:////SHARED/PATH/mlflow.db on storage the nodes "
        "share (--trust-cluster if the cluster keeps the run otherwise)\n"
    )
    assert done.stdout == ""


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("run.storage_path=runs", r"^run\.storage_path 'runs' is relative: .* working_dir"),
        ("tracking.tracking_uri=sqlite:///mlflow.db",
         r"^tracking\.tracking_uri 'sqlite:///mlflow\.db' is a relative SQLite file: it would "
         r"land in Ray's temporary copy of the working_dir"),
    ],
)  # fmt: skip
def test_a_relative_run_folder_or_store_is_refused(
    project: Path, cluster_never_asked: list[list[str]], override: str, message: str
) -> None:
    with pytest.raises(RecipeError, match=message):
        submit.submit("recipes/mine.yaml", [override])
    assert cluster_never_asked == []


def test_without_a_working_dir_a_relative_run_folder_is_refused_too(
    project: Path, cluster_never_asked: list[list[str]]
) -> None:
    """It resolves in whatever folder the cluster runs the job in, on one node."""
    with pytest.raises(RecipeError, match=r"land in the folder the cluster runs the job in"):
        submit.submit("recipes/mine.yaml", ["run.storage_path=runs"], ship=False)


def test_a_server_that_does_not_answer_from_here_is_refused(
    project: Path, cluster_never_asked: list[list[str]]
) -> None:
    uri = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(RecipeError) as refused:
        submit.submit("recipes/mine.yaml", [f"tracking.tracking_uri={uri}"])
    assert str(refused.value).startswith(
        f"tracking.tracking_uri {uri} does not answer from this machine (Connection refused), "
        "the only place submit can ask from; "
    )


def test_a_runtime_env_store_is_checked_and_named_by_its_file(
    project: Path, submitted: list[list[str]], tmp_path: Path, health_server: str
) -> None:
    """The recipe leaves tracking_uri unset: the job takes $MLFLOW_TRACKING_URI of its runtime
    env, which is checked as the recipe's would be."""
    (project / "recipes" / "mine.yaml").write_text(DIGITS.read_text())  # no tracking section
    env_file = tmp_path / "env.yaml"
    env_file.write_text("env_vars:\n  MLFLOW_TRACKING_URI: sqlite:///mlflow.db\n")
    storage = [f"run.storage_path={tmp_path / 'runs'}"]
    with pytest.raises(RecipeError, match=rf"^MLFLOW_TRACKING_URI in {env_file} 'sqlite:///"):
        submit.submit("recipes/mine.yaml", storage, runtime_env_file=env_file)
    env_file.write_text(f"env_vars:\n  MLFLOW_TRACKING_URI: {health_server}\n")
    assert submit.submit("recipes/mine.yaml", storage, runtime_env_file=env_file) == 0
    assert _runtime_env(submitted[0])["env_vars"]["MLFLOW_TRACKING_URI"] == health_server


def test_kept_setups_pass(
    project: Path, submitted: list[list[str]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Remote storage, the cluster node's home, no tracking at all, and a Kubernetes service
    name — which resolves only inside its cluster, so it is not asked from here."""
    from trainforge.driver import submit_checks

    def never(*args: object) -> str:
        raise AssertionError("a cluster-internal name was asked from this machine")

    monkeypatch.setattr(submit_checks, "health_problem", never)
    for overrides in (
        ["run.storage_path=s3://bucket/runs"],
        ["run.storage_path=~/runs"],
        ["tracking.enabled=false", "tracking.tracking_uri=sqlite:///mlflow.db"],
        ["tracking.tracking_uri=http://mlflow.trainforge.svc:5000"],
        ["tracking.tracking_uri=https://mlflow.trainforge.svc.cluster.local"],
    ):
        assert submit.submit("recipes/mine.yaml", overrides) == 0, overrides
    assert len(submitted) == 5


def test_trust_cluster_skips_the_checks_but_not_a_malformed_uri(
    project: Path, submitted: list[list[str]], tmp_path: Path
) -> None:
    """A cluster whose nodes set MLFLOW_TRACKING_URI themselves, or reach a server this
    machine does not: the user vouches for it."""
    assert cli.main(["submit", "digits_simple_cnn", "--trust-cluster"]) == 0
    assert len(submitted) == 1
    env_file = tmp_path / "env.yaml"
    env_file.write_text("env_vars:\n  MLFLOW_TRACKING_URI: /shared/mlruns\n")
    with pytest.raises(RecipeError, match=r"MLflow's file store is gone"):
        submit.submit("digits_simple_cnn", [], runtime_env_file=env_file, trust_cluster=True)
