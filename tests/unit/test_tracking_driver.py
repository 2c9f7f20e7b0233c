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

from trainforge import config, settings
from trainforge.config.schema import TrackingSection
from trainforge.tracking import driver
from trainforge.tracking.client import FAILURE_TAG, RUNS_FILE, RunHandle, run_url, runs_view
from trainforge.tracking.spool import SPOOL_FILE, Spool, replay, send
from trainforge.tracking.worker import Sender

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


@pytest.mark.parametrize(
    "args", [["-q", "r.yaml"], ["--verbose", "r.yaml", "a=1"], ["-v", "--", "r.yaml"]]
)
def test_the_recipe_is_read_past_the_flags_before_it(args: list[str]) -> None:
    # `trainforge train -q r.yaml`, the order `--help` shows: the recipe, not the flag
    _, recipe = driver.invocation(["trainforge", "train", *args])
    assert recipe == "r.yaml"
    tags = driver.source_tags(False, ["trainforge", "train", *args])
    assert tags["mlflow.source.name"] == "r.yaml"
    assert tags["mlflow.note.content"].endswith("Recipe: `r.yaml`")


def test_source_tags_fill_what_the_mlflow_ui_shows(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(settings.GIT_COMMIT.name, "0123456789abcdef")
    monkeypatch.delenv(settings.USER.name, raising=False)
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
    monkeypatch.setenv(settings.USER.name, "alice")  # set by `trainforge submit` for the job
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


def _run_recipe(storage: Path | str, uri: str, *more: str) -> config.Recipe:
    overrides = [f"run.storage_path={storage}", f"tracking.tracking_uri={uri}", *more]
    return config.load(DIGITS, overrides)


def test_a_run_in_a_real_store_has_source_user_commit_and_comparable_params(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(settings.GIT_COMMIT.name, "fedcba9876543210")
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


def test_a_server_that_refuses_the_credentials_or_the_user_is_not_called_unreachable() -> None:
    """MLflow's errors as its client raises them for a basic-auth server's 401 (a body that is
    not JSON) and 403 (JSON)."""
    from mlflow.exceptions import MlflowException, RestException
    from mlflow.protos.databricks_pb2 import UNAUTHENTICATED

    refused = MlflowException("API request to endpoint /api/2.0/mlflow/experiments/get-by-name "
                              "failed with error code 401 != 200. Response body: 'You are not "
                              "authenticated.'", error_code=UNAUTHENTICATED)  # fmt: skip
    assert driver.not_reached(refused, "trainforge") == (
        "refused the credentials (401, not authenticated): check the user and password in "
        "tracking.tracking_uri (http://user:password@host) or in MLFLOW_TRACKING_USERNAME and "
        "MLFLOW_TRACKING_PASSWORD"
    )
    denied = RestException({"error_code": "PERMISSION_DENIED", "message": "Permission denied"})
    assert driver.not_reached(denied, "shared").startswith(
        "refused the user access to experiment 'shared' (403, permission denied)"
    )
    down = ConnectionError("https://***@127.0.0.1:1/health did not answer")
    assert driver.not_reached(down, "trainforge") == f"is unreachable ({down})"


def _start(cfg: config.Recipe, folder: Path) -> RunHandle:
    """The MLflow run of a run whose folder is ``folder``."""
    return driver.start_run(
        cfg.tracking, cfg.run.name, config.to_container(cfg), config.to_yaml(cfg),
        str(folder / SPOOL_FILE),
    )  # fmt: skip


def test_a_run_folder_reopens_its_own_mlflow_run_and_another_of_the_same_name_gets_its_own(
    tmp_path: Path,
) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    cfg = _run_recipe(tmp_path / "runs", uri)
    mine = tmp_path / "project-a" / "runs" / cfg.run.name
    first, again = _start(cfg, mine), _start(cfg, mine)
    assert (first.resumed, again.resumed) == (False, True) and again.run_id == first.run_id
    # the same run.name elsewhere (another project, another user of the server): another run
    theirs = _start(cfg, tmp_path / "project-b" / "runs" / cfg.run.name)
    assert not theirs.resumed and theirs.run_id != first.run_id
    assert _start(cfg, mine).run_id == first.run_id  # and each folder keeps its own
    # a run deleted in MLflow is not reopened: the folder's next command makes a new one
    client.delete_run(first.run_id)
    fresh = _start(cfg, mine)
    assert not fresh.resumed and fresh.run_id not in (first.run_id, theirs.run_id)
    # a folder an older trainforge began (checkpoints, no record) finds its run by name
    older = tmp_path / "older" / cfg.run.name
    (older / "checkpoint_000001").mkdir(parents=True)
    found = _start(cfg, older)
    assert found.resumed and found.run_id in (theirs.run_id, fresh.run_id)
    assert _start(cfg, older).run_id == found.run_id
    # s3:// storage: no folder here is the run's (a later command may run elsewhere), so the
    # run is found by its name
    remote = _run_recipe("s3://bucket/runs", uri)
    spooled_here = tmp_path / "trainforge-spool" / cfg.run.name
    assert _start(remote, spooled_here).run_id in (theirs.run_id, fresh.run_id)
    assert not (spooled_here / RUNS_FILE).exists()
    names = {r.info.run_id for r in client.search_runs([client.get_experiment_by_name(
        cfg.tracking.experiment).experiment_id])}  # fmt: skip
    assert names == {theirs.run_id, fresh.run_id}  # nothing made twice


def test_a_run_resumed_with_a_changed_recipe_records_each_change_as_a_tag(tmp_path: Path) -> None:
    """MLflow keeps a param's first value for good: the params stay what the run began with, a
    tag per changed key says old and new, and a key changed back loses its tag."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    folder = tmp_path / "runs" / "digits"
    first = _start(_run_recipe(tmp_path / "runs", uri), folder)
    changed = _run_recipe(tmp_path / "runs", uri)
    changed.train.lr, changed.train.weight_decay = 0.01, 0.05
    assert _start(changed, folder).run_id == first.run_id
    run = client.get_run(first.run_id).data
    assert run.params["train.lr"] == "0.002"  # as begun
    assert {k: v for k, v in run.tags.items() if k.startswith("trainforge.changed.")} == {
        "trainforge.changed.train.lr": "0.002 -> 0.01",
        "trainforge.changed.train.weight_decay": "0.0 -> 0.05",
    }
    changed.train.weight_decay = 0.0  # back as it was
    _start(changed, folder)
    tags = client.get_run(first.run_id).data.tags
    assert [k for k in tags if k.startswith("trainforge.changed.")] == [
        "trainforge.changed.train.lr"
    ]


def test_a_reopened_run_is_sent_only_the_steps_it_has_no_metrics_of(tmp_path: Path) -> None:
    """An attempt that sent metrics past the checkpoint the next one resumes from (a newest
    checkpoint that turned out corrupt, a command killed between the two): the recomputed
    steps are not sent again, on either route (the worker's sender, the command's relay and
    spool format). System metrics count their own samples and are not a step."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    cfg = _run_recipe(tmp_path / "runs", uri)
    folder = tmp_path / "runs" / cfg.run.name
    first = _start(cfg, folder)
    assert first.logged_through == -1
    assert first.run_id is not None
    for step in range(10, 60, 10):
        client.log_metric(first.run_id, "train/loss", 1.0 / step, step=step)
    client.log_metric(first.run_id, "system/cpu_utilization_percentage", 5.0, step=900)
    again = _start(cfg, folder)
    assert (again.run_id, again.logged_through) == (first.run_id, 50)
    rows = [("train/loss", 1.0 / step, 0, step) for step in range(30, 90, 10)]
    sender = Sender(again)
    sender.start()
    sender.send(rows[:3])  # steps 30-50: sent before, left out
    assert sender.stop(wait_s=10) == []
    send(client, again.run_id, {"kind": "metrics", "metrics": rows[3:]}, again.logged_through)
    history = client.get_metric_history(first.run_id, "train/loss")
    assert sorted(m.step for m in history) == [10, 20, 30, 40, 50, 60, 70, 80]


def test_a_spool_synced_into_a_new_run_is_the_run_its_folder_reopens(tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = _run_recipe(tmp_path / "runs", uri)
    theirs = _start(cfg, tmp_path / "theirs" / cfg.run.name)  # the same name, on the server
    folder = tmp_path / "mine" / cfg.run.name
    # what a command that never reached the server wrote: no run id
    unseen = RunHandle(uri, cfg.tracking.experiment, cfg.run.name, None, False,
                       str(folder / SPOOL_FILE))  # fmt: skip
    Spool.of(unseen).write("params", params={"train.lr": "0.5"})
    replay(folder / SPOOL_FILE)
    synced = _start(cfg, folder)  # the run's next command
    assert synced.resumed and synced.run_id != theirs.run_id
    client = MlflowClient(tracking_uri=uri)
    assert client.get_run(synced.run_id).data.params["train.lr"] == "0.5"
    assert str(cfg.train.lr) != "0.5"
    assert client.get_run(theirs.run_id).data.params["train.lr"] == str(cfg.train.lr)


def test_library_versions_come_from_whichever_distribution_is_installed() -> None:
    from importlib.metadata import version

    from trainforge.tracking.driver import _installed

    # MLflow may be installed as mlflow-skinny alone: the next name is tried
    assert _installed("no-such-distribution-here", "torch") == version("torch")
    assert _installed("no-such-distribution-here") == "unknown"  # a tag, never a crash


def test_a_run_that_finishes_after_a_failed_attempt_no_longer_carries_its_failure(
    tmp_path: Path,
) -> None:
    """Live and through the spool: a resumed run that ends FINISHED drops the failure tag a
    failed attempt left; a run that fails again keeps the new one."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("trainforge")
    for route in ("live", "spool"):
        run_id = client.create_run(experiment).info.run_id
        handle = RunHandle(uri, "trainforge", route, run_id, False, str(tmp_path / route))
        driver.finish_run(handle, "FAILED", None, reason="disk full")
        assert client.get_run(run_id).data.tags[FAILURE_TAG] == "disk full"
        if route == "live":
            driver.finish_run(handle, "FINISHED", None)
        else:
            Spool.of(handle).write("status", status="FINISHED")
            replay(handle.spool_path)
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED" and FAILURE_TAG not in run.data.tags, route
    driver.finish_run(handle, "FINISHED", None)  # never failed: nothing to drop, no error


def test_a_new_run_starts_when_the_command_did_and_its_experiment_opens_on_its_runs(
    tmp_path: Path,
) -> None:
    """MLflow's duration of a run is the command's (the run is made beside the workers, seconds
    after the command began); a resumed run keeps its first start. The experiment is marked as
    one of trained models, so MLflow 3's UI opens it on its runs, not on its GenAI overview;
    ``trainforge ui`` names that view (``runs_view``)."""
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    client = MlflowClient(tracking_uri=uri)
    cfg = _run_recipe(tmp_path / "runs", uri)
    args = (cfg.tracking, cfg.run.name, config.to_container(cfg), "", str(tmp_path / SPOOL_FILE))
    began = 1_700_000_000.25
    handle = driver.start_run(*args, started=began)
    assert client.get_run(str(handle.run_id)).info.start_time == 1_700_000_000_250
    again = driver.start_run(*args, started=began + 60)
    assert again.resumed and client.get_run(str(again.run_id)).info.start_time == 1_700_000_000_250
    experiment = client.get_experiment_by_name(cfg.tracking.experiment)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    # one made elsewhere without a kind is marked too, once a run is made in it (its artifacts
    # in a folder of the test's: MLflow's default is ./mlruns, the repository's)
    client.create_experiment("elsewhere", artifact_location=str(tmp_path / "elsewhere"))
    other = _run_recipe(tmp_path / "other", uri, "tracking.experiment=elsewhere")
    _start(other, tmp_path / "other" / other.run.name)
    kind = client.get_experiment_by_name("elsewhere").tags["mlflow.experimentKind"]
    assert kind == "custom_model_development"
    served = "http://127.0.0.1:5000"
    assert runs_view(uri, cfg.tracking.experiment, served) == (
        f"{served}/#/experiments/{experiment.experiment_id}/runs"
    )
    assert runs_view(uri, "none-such", served) == served
    assert run_url(uri, str(handle.run_id)) is None  # a local store: no server to link to


def test_a_sqlite_store_keeps_its_runs_artifacts_beside_it_whichever_folder_the_command_ran_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store named in another folder: the run's recipe and learning curve land in
    ``mlruns/<experiment id>`` beside the database, nothing in the command's folder (MLflow's
    default, ``./mlruns``, is the working directory's). The embedded ``./mlflow.db`` has them
    in the same place as ever, its folder's ``mlruns``."""
    store, here = tmp_path / "store", tmp_path / "here"
    store.mkdir()
    here.mkdir()
    monkeypatch.chdir(here)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    uri = f"sqlite:///{store}/mlflow.db"
    cfg = _run_recipe(tmp_path / "runs", uri)
    handle = _start(cfg, tmp_path / "runs" / cfg.run.name)
    client = MlflowClient(tracking_uri=uri)
    client.log_metric(str(handle.run_id), "train/loss", 0.5, step=1)
    driver.finish_run(handle, "FINISHED", None)
    run = client.get_run(str(handle.run_id))
    experiment = run.info.experiment_id
    assert client.get_experiment(experiment).artifact_location == str(store / "mlruns" / experiment)
    artifacts = store / "mlruns" / experiment / run.info.run_id / "artifacts"
    assert (artifacts / "recipe.yaml").is_file()
    assert (artifacts / "plots" / "learning_curve.svg").is_file()
    assert list(here.iterdir()) == []

    monkeypatch.chdir(store)  # the embedded default: the same folder as before
    embedded = _run_recipe(tmp_path / "runs", "sqlite:///mlflow.db", "tracking.experiment=own")
    again = _start(embedded, tmp_path / "runs" / "own")
    made = client.get_experiment(client.get_run(str(again.run_id)).info.experiment_id)
    assert made.artifact_location == str(store / "mlruns" / made.experiment_id)
