"""trainforge.tracking.driver: the MLflow run the driver opens — MLflow's own source/user/git
tags and description, params that compare across machines, and no credentials anywhere (a
real SQLite store; an unreachable server for the spool)."""

from __future__ import annotations

import getpass
import socket
import sys
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from trainforge import config
from trainforge.config.schema import TrackingSection
from trainforge.tracking import driver
from trainforge.tracking.spool import SPOOL_FILE

REPO = Path(__file__).resolve().parents[2]
DIGITS = REPO / "recipes" / "cnn" / "digits_simple_cnn.yaml"


@pytest.mark.parametrize(
    "argv0", ["/usr/local/bin/trainforge", str(REPO / "runtime" / "__main__.py")],
    ids=["console-script", "python-m"],
)  # fmt: skip
def test_the_command_line_and_recipe_are_read_from_argv(argv0: str) -> None:
    command, recipe = driver.invocation([argv0, "train", "recipes/my run.yaml", "train.lr=0.1"])
    assert command == "trainforge train 'recipes/my run.yaml' train.lr=0.1"
    assert recipe == "recipes/my run.yaml"
    assert driver.invocation(["/usr/bin/python3", "script.py"]) == (
        "python3 script.py",
        None,
    )


def test_source_tags_fill_what_the_mlflow_ui_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(driver.GIT_COMMIT_ENV, "0123456789abcdef")
    monkeypatch.delenv(driver.USER_ENV, raising=False)
    tags = driver.source_tags(False, ["trainforge", "train", "cnn/digits_simple_cnn", "a=1"])
    assert tags == {
        "mlflow.source.name": "cnn/digits_simple_cnn",
        "mlflow.source.type": "LOCAL",
        "mlflow.user": getpass.getuser(),
        "mlflow.note.content": "`trainforge train cnn/digits_simple_cnn a=1`\n\n"
        "Recipe: `cnn/digits_simple_cnn`",
        "mlflow.source.git.commit": "0123456789abcdef",
        "git.commit": "0123456789abcdef",
    }
    monkeypatch.setenv(driver.USER_ENV, "alice")  # set by `trainforge submit` for the job
    submitted = driver.source_tags(True, ["trainforge", "train", "x.yaml"])
    assert submitted["mlflow.user"] == "alice" and submitted["mlflow.source.type"] == "JOB"


def test_machine_paths_are_tags_and_the_rest_params() -> None:
    params = {
        "run.storage_path": "/home/me/runs",
        "workload.data_root": "~/data",
        "tracking.tracking_uri": "sqlite:////home/me/mlflow.db",
        "train.lr": "0.1",
        "workload.model": "torchvision:resnet18",
        "run.name": "digits",
        "tracking.experiment": "https://host/x",
    }
    kept, tags = driver.split_params(params)
    assert set(tags) == {"run.storage_path", "workload.data_root", "tracking.tracking_uri"}
    assert kept == {k: v for k, v in params.items() if k not in tags}


def _run_recipe(storage: Path, uri: str) -> config.Recipe:
    overrides = [f"run.storage_path={storage}", f"tracking.tracking_uri={uri}"]
    return config.load(DIGITS, overrides)


def test_a_run_in_a_real_store_has_source_user_commit_and_comparable_params(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(driver.GIT_COMMIT_ENV, "fedcba9876543210")
    monkeypatch.setattr(sys, "argv", ["trainforge", "train", str(DIGITS)])
    driver.invoked_as([])
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = _run_recipe(tmp_path / "runs", uri)
    handle = driver.start_run(
        cfg.tracking, cfg.run.name, config.to_container(cfg), config.to_yaml(cfg),
        str(tmp_path / "runs" / SPOOL_FILE),
    )  # fmt: skip
    assert handle.run_id is not None
    run = MlflowClient(tracking_uri=uri).get_run(handle.run_id)
    tags, params = run.data.tags, run.data.params
    assert tags["mlflow.source.git.commit"] == "fedcba9876543210"
    assert tags["mlflow.source.name"] == str(DIGITS)
    assert tags["mlflow.user"] == run.info.user_id == getpass.getuser()  # "Created by" links
    assert tags["mlflow.note.content"].startswith(f"`trainforge train {DIGITS}`")
    assert tags["run.storage_path"] == str(tmp_path / "runs")
    assert tags["tracking.tracking_uri"] == uri
    assert "run.storage_path" not in params and "tracking.tracking_uri" not in params
    assert params["train.lr"] == str(cfg.train.lr)
    assert not [v for v in params.values() if str(tmp_path) in v]


def test_credentials_in_the_tracking_uri_never_reach_the_console_params_or_spool(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as probe:  # nothing listens there: the run is spooled
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    uri = f"https://trainer:s3cret-pw@127.0.0.1:{port}"
    cfg = _run_recipe(tmp_path / "runs", uri)
    assert isinstance(cfg.tracking, TrackingSection)
    spool = tmp_path / "runs" / SPOOL_FILE
    handle = driver.start_run(
        cfg.tracking, cfg.run.name, config.to_container(cfg), config.to_yaml(cfg), str(spool)
    )
    assert handle.run_id is None and handle.tracking_uri == uri  # the client still has them
    written = spool.read_text()
    err = capsys.readouterr().err
    for text in (written, err):
        assert "s3cret-pw" not in text and "trainer:" not in text
    assert f"https://***@127.0.0.1:{port}" in written and f"https://***@127.0.0.1:{port}" in err


def test_library_versions_come_from_whichever_distribution_is_installed() -> None:
    from importlib.metadata import version

    from trainforge.tracking.driver import _installed

    # MLflow may be installed as mlflow-skinny alone: the next name is tried
    assert _installed("no-such-distribution-here", "torch") == version("torch")
    assert _installed("no-such-distribution-here") == "unknown"  # a tag, never a crash
