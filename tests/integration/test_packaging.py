"""trainforge installed from its wheel, not from the checkout: the wheel is built, installed into
a fresh virtual environment, and used from a user's project folder elsewhere — shipped recipes by
name, `validate`, and `submit` to a real `ray start --head` started from that environment, so the
job's `python -m trainforge` and its Ray workers run the installed wheel too.

The venv reuses this Python's third-party packages (torch, ray, mlflow …) through a ``deps.pth``
naming this site-packages folder: a .pth file inside a folder added that way is not processed,
so the checkout's editable-install finder (a .pth here) does not leak into the venv.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.git_repo import commit_all
from tests.integration.ray_nodes import RayNodes

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
# what the wheel is built from (pyproject's package-dir); nothing else of the checkout
SOURCES = ["pyproject.toml", "README.md", "runtime", "recipes", "deploy"]


def _build_wheel(tmp_path: Path) -> Path:
    """`pip wheel` in a copy: building in the checkout leaves a build/ folder behind whose
    stale files (a deleted recipe) a later wheel would still pick up."""
    source = tmp_path / "source"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in SOURCES:
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, source / name, ignore=ignore)
        else:
            shutil.copy2(REPO / name, source / name)
    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
         "--wheel-dir", str(wheels), str(source)],
        check=True, timeout=300,
    )  # fmt: skip
    (wheel,) = wheels.glob("trainforge-*.whl")
    return wheel


def _make_venv(tmp_path: Path, wheel: Path) -> Path:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    # this Python's pip installs into the venv: faster than bootstrapping pip there
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps",
         "--no-index", str(wheel)],
        check=True, timeout=300,
    )  # fmt: skip
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True,
    ).stdout.strip()  # fmt: skip
    (Path(site) / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # `ray start` from the venv's Python: the raylet starts workers with the interpreter that
    # started it, and the job's `python` is found on the head's PATH (the venv's bin first)
    ray = venv / "bin" / "ray"
    ray.write_text(
        f"#!{python}\nimport sys\nfrom ray.scripts.scripts import main\nsys.exit(main())\n"
    )
    ray.chmod(0o755)
    return venv


def _project(tmp_path: Path) -> tuple[Path, str]:
    """A user's project: a git repository with a file of its own, not the checkout."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "from_the_project.txt").write_text("shipped as the job's working_dir\n")
    return project, commit_all(project)


def _check_installed_cli(run: Callable[..., subprocess.CompletedProcess[str]], venv: Path) -> None:
    where = run("python", "-c", "import trainforge, importlib.util as u; "
                "print(trainforge.__file__, u.find_spec('runtime'))")  # fmt: skip
    assert where.returncode == 0, where.stderr
    package_file, runtime_spec = where.stdout.split()
    assert Path(package_file).is_relative_to(venv), package_file  # the wheel, not the checkout
    assert runtime_spec == "None"
    listed = run("trainforge", "recipes")
    assert listed.returncode == 0, listed.stderr
    assert "cnn/digits_simple_cnn" in listed.stdout
    validated = run("trainforge", "validate", "cnn/digits_simple_cnn")  # by name
    assert validated.returncode == 0, validated.stderr
    assert "dataset: digits" in validated.stdout


def test_installed_wheel_validates_and_submits_a_shipped_recipe(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    tops = {name.split("/", 1)[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"trainforge", wheel.name.split("-py3")[0] + ".dist-info"}  # no `runtime`
    venv = _make_venv(tmp_path, wheel)
    project, commit = _project(tmp_path)
    # the cluster's own temp dir: the job's unpacked working_dir is found there and not among
    # another Ray's on this machine
    nodes = RayNodes(tmp_path)
    ray_temp = nodes.temp_dir
    env = nodes.env  # RAY_AUTH_MODE=token: what every client of the head needs
    env.update(PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}", VIRTUAL_ENV=str(venv))
    env.pop("PYTHONPATH", None)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(args), cwd=project, env=env, capture_output=True, text=True, timeout=600
        )

    # the head takes ~15 s to come up: start it while the installed CLI is checked
    with ThreadPoolExecutor(1) as pool:
        head = pool.submit(nodes.start_head, "--num-cpus=2")
        try:
            _check_installed_cli(run, venv)
            head.result()
            done = run("trainforge", "submit", "digits_simple_cnn", "run.name=from-wheel",
                       "train.epochs=1", "scaling.num_workers=1", "tracking.system_metrics=false",
                       f"run.storage_path={tmp_path / 'runs'}",
                       f"tracking.tracking_uri=sqlite:///{tmp_path / 'mlflow.db'}",
                       "--address", nodes.dashboard)  # fmt: skip
            assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
            assert "-- python -m trainforge train cnn/digits_simple_cnn" in done.stdout
            # `ray job submit` waits, then reports the job's status: SUCCEEDED reads "succeeded"
            # (asking the head again would cost a fresh process: ~3 s)
            assert "Job 'from-wheel' succeeded" in done.stdout, done.stdout[-4000:]
            # the job ran in the unpacked project: Ray unpacked the working_dir in its temp dir
            unpacked = list(ray_temp.glob("session_*/runtime_resources/working_dir_files/*"))
            assert [p for p in unpacked if (p / "from_the_project.txt").is_file()], unpacked
        finally:
            head.exception()  # a head that is still starting has registered its process
            nodes.stop()
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    (mlflow_run,) = client.search_runs(
        [client.get_experiment_by_name("trainforge").experiment_id],
        "tags.`trainforge.run_name` = 'from-wheel'",
    )
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.tags["git.commit"] == commit  # the project's, not the checkout's
