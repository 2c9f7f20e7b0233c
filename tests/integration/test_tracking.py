"""Tracking against a real `mlflow server` on 127.0.0.1 and a real headless Chromium.

A training run made through `trainforge train` is read back with MlflowClient (params, tags,
metric history, artifacts, the logged model, status) and opened in the MLflow UI. The server
is stopped in the middle of another run: training finishes with exit 0 and the missing data
comes back with `trainforge tracking-sync`.
"""

from __future__ import annotations

import contextlib
import getpass
import io
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import mlflow
import pytest
import torch
from mlflow.tracking import MlflowClient
from omegaconf import OmegaConf

from tests.browser import CHROMIUM, CHROMIUM_FLAGS
from tests.git_repo import commit_all
from tests.integration.mlflow_server import MlflowServer, answers, free_port
from trainforge.cli import main as cli_main
from trainforge.tracking.client import runs_view

pytestmark = [pytest.mark.ray, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DIGITS = ROOT / "recipes" / "cnn" / "digits_simple_cnn.yaml"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    server = MlflowServer(tmp_path_factory.mktemp("mlflow-server")).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def served_run(ray_cluster, server: MlflowServer, tmp_path_factory: pytest.TempPathFactory):
    """One real training run through the CLI, tracked by the server, from a project folder
    under git (its commit is the run's) holding the recipe."""
    workdir = tmp_path_factory.mktemp("served-run")
    shutil.copy(DIGITS, workdir / DIGITS.name)
    commit = commit_all(workdir)
    previous = Path.cwd()
    os.chdir(workdir)
    began = time.time()
    try:  # the system metrics at their default interval: a run this short has some
        with contextlib.redirect_stdout(io.StringIO()) as shown:
            code = cli_main(
                ["train", DIGITS.name, "run.name=served", "train.epochs=4",
                 f"tracking.tracking_uri={server.url}", "tracking.profile_steps=2"]
            )  # fmt: skip
    finally:
        os.chdir(previous)
    sys.stdout.write(shown.getvalue())
    assert code == 0
    client = MlflowClient(tracking_uri=server.url)
    experiment = client.get_experiment_by_name("trainforge")
    (run,) = client.search_runs([experiment.experiment_id], "tags.`trainforge.run_name` = 'served'")
    return client, run, commit, began, shown.getvalue()


# a logged model, loaded where trainforge is not installed (its editable install's finder taken
# out, no PYTHONPATH): its class's module comes from the code shipped with it
LOAD_ALONE = """
import importlib.util, sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in f.__module__]
assert importlib.util.find_spec("trainforge") is None, "trainforge is importable here"
import mlflow.pytorch, torch
model = mlflow.pytorch.load_model(sys.argv[1])
print(type(model).__name__, tuple(model(torch.randn(3, 1, 32, 32)).shape))
"""


@pytest.mark.xdist_group("served-run")  # one worker makes the served run once
def test_run_is_complete_in_the_mlflow_server(
    served_run, server: MlflowServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, run, commit, began, console = served_run
    run_id = run.info.run_id
    assert run.info.status == "FINISHED"
    # MLflow's duration is the command's: the run starts when the command did, not once made
    assert int(began * 1000) <= run.info.start_time < began * 1000 + 500
    # the closing table links the run's page on the server
    url = f"{server.url}/#/experiments/{run.info.experiment_id}/runs/{run_id}"
    assert re.search(rf"mlflow run +{re.escape(url)}$", console, re.MULTILINE), console
    params, tags = run.data.params, run.data.tags
    assert params["train.epochs"] == "4" and params["workload.model"] == "simple_cnn"
    assert params["scaling.num_workers"] == "2"
    assert tags["mlflow.source.git.commit"] == tags["git.commit"] == commit
    assert tags["mlflow.source.name"] == DIGITS.name and tags["mlflow.source.type"] == "LOCAL"
    assert tags["mlflow.user"] == run.info.user_id == getpass.getuser()
    (dataset,) = run.inputs.dataset_inputs
    assert json.loads(dataset.dataset.profile)["num_rows"] == 1437  # digits' training split
    assert tags["world_size"] == "2" and tags["node_count"] == "1"
    assert (
        tags["version.torch"] == torch.__version__ and tags["version.mlflow"] == mlflow.__version__
    )
    checkpoint = Path(tags["trainforge.last_checkpoint"])
    assert checkpoint.name.startswith("checkpoint_") and (checkpoint / "state.pt").is_file()

    steps = [m.step for m in client.get_metric_history(run_id, "train/loss")]
    assert steps == sorted(set(steps)) and len(steps) == 8  # every 10 of 88 steps, no repeats
    epochs = [m.value for m in client.get_metric_history(run_id, "epoch")]
    assert epochs == [1, 2, 3, 4]
    assert run.data.metrics["val/accuracy"] > 0.8
    assert any(key.startswith("system/node_0/cpu_utilization") for key in run.data.metrics)
    assert "perf/samples_per_s" in run.data.metrics

    def files(path: str | None = None) -> set[str]:
        out = set()
        for item in client.list_artifacts(run_id, path):
            out |= files(item.path) if item.is_dir else {item.path}
        return out

    assert {"recipe.yaml", "plots/learning_curve.svg", "plots/confusion_matrix.svg",
            "model_state/state_dict.pt", "profiler/trace_rank0.json"} <= files()  # fmt: skip
    recipe = OmegaConf.load(client.download_artifacts(run_id, "recipe.yaml", str(tmp_path)))
    assert recipe.run.name == "served" and recipe.train.epochs == 4

    state_file = client.download_artifacts(run_id, "model_state/state_dict.pt", str(tmp_path))
    state = torch.load(state_file, weights_only=True)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", client.tracking_uri)  # for mlflow's fluent API
    models = mlflow.search_logged_models(
        experiment_ids=[run.info.experiment_id],
        filter_string=f"source_run_id = '{run_id}'",
        output_format="list",
    )
    assert len(models) == 1
    (model,) = models
    # named after the recipe's model, linked to the evaluation's metrics (not the system's),
    # and from the recipe, as the run is
    assert model.name == "simple_cnn"
    linked = {m.key: m.value for m in model.metrics}
    assert {"val/loss", "val/accuracy"} <= linked.keys(), linked
    assert linked["val/accuracy"] == run.data.metrics["val/accuracy"]
    assert not [k for k in linked if k.startswith(("system/", "train/", "perf/"))], linked
    assert model.tags["mlflow.source.name"] == DIGITS.name
    assert model.params["train.epochs"] == "4"
    # only the code its classes need ships with it, and it loads with that alone: in a new
    # process that cannot import the trainforge of this checkout
    code = Path(mlflow.artifacts.download_artifacts(f"{model.artifact_location}/code"))
    shipped = sorted(str(f.relative_to(code)) for f in code.rglob("*.py"))
    assert "trainforge/workloads/cnn/models.py" in shipped and len(shipped) <= 6, shipped
    assert sum(f.stat().st_size for f in code.rglob("*.py")) < 30_000
    elsewhere = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    loads = subprocess.run(
        [sys.executable, "-c", LOAD_ALONE, f"models:/{model.model_id}"], cwd=tmp_path,
        env=elsewhere | {"MLFLOW_TRACKING_URI": client.tracking_uri}, capture_output=True,
        text=True, timeout=300,
    )  # fmt: skip
    assert loads.returncode == 0, loads.stderr[-3000:]
    assert loads.stdout.strip() == "SimpleCNN (3, 10)"
    kept = list(sys.path)  # MLflow puts the model's cut-down trainforge first on it: undone,
    loaded = mlflow.pytorch.load_model(f"models:/{model.model_id}")  # for later spawns' sake
    sys.path[:] = kept
    # pickled, not MLflow's default torch.export program: the recipe's own module comes back
    assert type(loaded).__name__ == "SimpleCNN"
    loaded_state = loaded.state_dict()
    assert loaded_state.keys() == state.keys()
    assert all(torch.equal(loaded_state[k], state[k]) for k in state)
    assert loaded(torch.randn(3, 1, 32, 32)).shape == (3, 10)


@pytest.mark.xdist_group("served-run")
def test_mlflow_ui_shows_the_run_in_headless_chromium(served_run, server, tmp_path: Path) -> None:
    """The run page's "About this run" as MLflow 3.17 renders it: Source is the recipe with the
    commit's short hash beside it (the whole hash in its popover), Created by the user, and
    Datasets the training data's name and digest, each value in its label's row; and the run's
    SVG figures drawn as images in its artifact view."""
    from playwright.sync_api import sync_playwright

    client, run, commit, _, _ = served_run
    tags = run.data.tags
    (dataset,) = run.inputs.dataset_inputs
    experiment_id = run.info.experiment_id
    url = f"{server.url}/#/experiments/{experiment_id}/runs/{run.info.run_id}"
    (model,) = client.search_logged_models(experiment_ids=[experiment_id])
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url)
            page.get_by_text("served").first.wait_for(timeout=60_000)
            page.get_by_text("val/accuracy").first.wait_for(timeout=60_000)
            page.screenshot(path=str(tmp_path / "mlflow_run.png"), full_page=True)
            rows = {
                label: page.get_by_test_id(f"key-value-{label}").inner_text().split("\n")
                for label in ("Source", "Created by")
            }
            datasets = page.locator("xpath=//h4[text()='Datasets']/..").inner_text().split("\n")
            commit_tag = page.locator(
                "[data-component-id='mlflow.run_details.overview.source.commit_hash']"
            ).first
            shown_commit = commit_tag.inner_text().strip()
            commit_tag.hover()
            page.get_by_text(commit).first.wait_for(timeout=10_000)  # the popover: all of it
            figures = {name: _shown_image_width(browser, f"{url}/artifacts/plots/{name}")
                       for name in ("learning_curve.svg", "confusion_matrix.svg")}  # fmt: skip
            shown = _run_params_and_model(page, model.model_id)
            model_page = _model_metrics(browser, f"{server.url}/#/experiments/{experiment_id}"
                                        f"/models/{model.model_id}", tmp_path)  # fmt: skip
            runs = _experiment_opened(browser, runs_view(server.url, "trainforge", server.url))
        finally:
            browser.close()
    # the run page: its params and metrics, and its logged model by name
    assert shown == {"train.epochs": True, "val/accuracy": True, "simple_cnn": True}
    # the model's page: the evaluation's metrics linked to it, with their values
    assert model_page["val/accuracy"] == f"{run.data.metrics['val/accuracy']}"[:6]
    assert "val/loss" in model_page and not [k for k in model_page if k.startswith("system/")]
    # the experiment as `trainforge ui` names it: its runs, not MLflow 3's GenAI overview
    where = runs["url"].partition("?")[0]  # the view's own filters follow
    assert where.endswith(f"/#/experiments/{experiment_id}/runs") and runs["served"], runs
    assert (tmp_path / "mlflow_run.png").stat().st_size > 10_000
    assert [line.strip() for line in rows["Source"] if line.strip()] == [
        "Source",
        tags["mlflow.source.name"],
        commit[:7],
    ]
    assert tags["mlflow.source.name"] == DIGITS.name and shown_commit == commit[:7]
    assert rows["Created by"] == ["Created by", tags["mlflow.user"]]
    assert figures == {"learning_curve.svg": 720, "confusion_matrix.svg": 480}  # drawn as images
    assert tags["mlflow.user"] == getpass.getuser()
    assert [line.strip() for line in datasets if line.strip()] == [
        "Datasets",
        f"{dataset.dataset.name} ({dataset.dataset.digest})",
        "Training",  # the context tag, capitalised by the UI's style
    ]
    assert dataset.dataset.name == "digits" and len(dataset.dataset.digest) == 8


def test_server_unreachable_at_start_spools_and_syncs(
    ray_cluster, server: MlflowServer, in_tmp: Path, capsys
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    code = cli_main(["train", str(DIGITS), "run.name=offline", "train.epochs=2",
                     f"tracking.tracking_uri={dead}"])  # fmt: skip
    assert code == 0
    err = capsys.readouterr().err
    assert err.count("is unreachable") == 1
    spool = in_tmp / "runs" / "offline" / "tracking-spool.jsonl"
    assert spool.is_file()

    assert cli_main(["tracking-sync", str(spool.parent), "--tracking-uri", server.url]) == 0
    assert not spool.exists()
    client = MlflowClient(tracking_uri=server.url)
    experiment = client.get_experiment_by_name("trainforge")
    (run,) = client.search_runs(
        [experiment.experiment_id], "tags.`trainforge.run_name` = 'offline'"
    )
    assert run.info.status == "FINISHED"
    assert run.data.params["train.epochs"] == "2"
    assert [m.value for m in client.get_metric_history(run.info.run_id, "epoch")] == [1, 2]

    names = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"recipe.yaml", "plots", "model_state"} <= names  # the whole comparison with a live
    # run, on every worker group: test_worker_groups.py


def test_server_stopped_mid_run_training_finishes_and_data_is_recovered(
    ray_cluster, tmp_path: Path
) -> None:
    server = MlflowServer(tmp_path / "server").start()
    workdir = tmp_path / "work"
    workdir.mkdir()
    command = [sys.executable, "-m", "trainforge", "train", str(DIGITS), "run.name=outage",
               "train.epochs=40", "scaling.num_workers=1", f"tracking.tracking_uri={server.url}",
               "tracking.system_metrics=false", "tracking.log_model=false"]  # fmt: skip
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address}
    training = subprocess.Popen(command, cwd=workdir, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        client = MlflowClient(tracking_uri=server.url)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and training.poll() is None:
            runs = client.search_runs(
                ["0", *[e.experiment_id for e in client.search_experiments()]]
            )
            if runs and client.get_metric_history(runs[0].info.run_id, "epoch"):
                break
            time.sleep(0.2)
        server.stop()  # mid-run: the first epoch's metrics are in, 39 epochs to go
        output, _ = training.communicate(timeout=300)
    finally:
        if training.poll() is None:
            training.kill()
    assert training.returncode == 0, output
    assert output.count("stopped answering") == 1, output

    spool = workdir / "runs" / "outage" / "tracking-spool.jsonl"
    assert spool.is_file()
    server.start()  # same port, same store
    sync = subprocess.run([sys.executable, "-m", "trainforge", "tracking-sync", str(spool.parent)],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert sync.returncode == 0, sync.stderr
    # what was sent, in words: the plots and model files, the metrics' batches, the run's end
    assert re.search(r"synced .*: \d+ files?, \d+ batch(es)? of metrics, 1 run status",
                     sync.stdout), sync.stdout  # fmt: skip
    try:
        (run,) = client.search_runs(
            [client.get_experiment_by_name("trainforge").experiment_id],
            "tags.`trainforge.run_name` = 'outage'",
        )
        epochs = [int(m.value) for m in client.get_metric_history(run.info.run_id, "epoch")]
        assert epochs == list(range(1, 41))  # continuous: nothing lost, nothing twice
        assert run.info.status == "FINISHED"
    finally:
        server.stop()


def test_ctrl_c_stops_the_run_as_killed(ray_cluster, tmp_path: Path) -> None:
    command = [sys.executable, "-m", "trainforge", "train", str(DIGITS), "run.name=ctrl-c",
               "train.epochs=500", "scaling.num_workers=1",
               "tracking.system_metrics=false"]  # fmt: skip
    env = {**os.environ, "RAY_ADDRESS": ray_cluster.get_runtime_context().gcs_address}
    training = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)  # fmt: skip
    try:
        checkpoints = tmp_path / "runs" / "ctrl-c"
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and training.poll() is None:
            if any(p.is_dir() for p in checkpoints.glob("checkpoint_*")):
                break
            time.sleep(0.2)
        training.send_signal(signal.SIGINT)
        output, _ = training.communicate(timeout=120)
    finally:
        if training.poll() is None:
            training.kill()
    assert training.returncode == 130, output
    assert "interrupted" in output
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name("trainforge").experiment_id])
    assert run.info.status == "KILLED"


def _session_commands(session: int) -> list[str]:
    """The command lines of the processes in a session (a process started in a new one)."""
    commands = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.getsid(int(entry.name)) == session:
                    commands.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
    return commands


def test_trainforge_ui_serves_the_embedded_store(in_tmp: Path) -> None:
    from mlflow.tracking import MlflowClient as Client

    store = Client(tracking_uri=f"sqlite:///{in_tmp / 'mlflow.db'}")
    experiment_id = store.create_experiment("seen-in-ui")
    port = free_port()
    ui = subprocess.Popen([sys.executable, "-m", "trainforge", "ui", "--port", str(port),
                           "--experiment", "seen-in-ui"],
                          cwd=in_tmp, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          start_new_session=True)  # fmt: skip
    try:
        # its /health first, one short request at a time: the client's own retries back off
        # for minutes, past any deadline here, while the server starts
        deadline = time.monotonic() + 120
        while not answers(f"http://127.0.0.1:{port}/health"):
            if time.monotonic() > deadline or ui.poll() is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(ui.pid, signal.SIGTERM)
                output = ui.communicate(timeout=30)[0].decode(errors="replace")
                raise AssertionError(f"`trainforge ui` never answered:\n{output[-3000:]}")
            time.sleep(0.5)
        names = [
            e.name for e in Client(tracking_uri=f"http://127.0.0.1:{port}").search_experiments()
        ]
        assert "seen-in-ui" in names
        # MLflow's job runner stays off (eight processes, ~1.8 GB): it starts with the server
        time.sleep(3)
        assert not [c for c in _session_commands(ui.pid) if "huey" in c or "_job_runner" in c]
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ui.pid, signal.SIGTERM)
        said = ui.communicate(timeout=30)[0].decode(errors="replace")
    # it names the experiment's runs view, and marks the experiment so the UI stays there
    assert f"at http://127.0.0.1:{port}/#/experiments/{experiment_id}/runs\n" in said, said
    kind = store.get_experiment(experiment_id).tags["mlflow.experimentKind"]
    assert kind == "custom_model_development"


def _run_params_and_model(page, model_id: str) -> dict[str, bool]:
    """Whether the run page (open in ``page``) shows a param, a metric and its logged model."""
    found = {}
    for text in ("train.epochs", "val/accuracy", "simple_cnn"):
        try:
            page.get_by_text(text, exact=True).first.wait_for(timeout=30_000)
            found[text] = True
        except Exception:
            found[text] = False
    return found


def _model_metrics(browser, url: str, folder: Path) -> dict[str, str]:
    """The metrics table of a logged model's page: each metric's shown value (its start)."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(url)
        page.get_by_text("val/accuracy").first.wait_for(timeout=60_000)
        page.screenshot(path=str(folder / "mlflow_model.png"), full_page=True)
        rows = page.locator("[role=row]").all_inner_texts()
    finally:
        page.close()
    shown = {}
    for row in rows:
        cells = [cell.strip() for cell in row.split("\n") if cell.strip()]
        for key in [c for c in cells if "/" in c and " " not in c]:
            values = [c for c in cells if re.fullmatch(r"-?[0-9.]+(e-?[0-9]+)?", c)]
            shown[key] = values[0][:6] if values else ""
    return shown


def _experiment_opened(browser, url: str) -> dict[str, Any]:
    """Where the UI stays when the experiment's link is opened, and whether it lists the run."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(url)
        page.get_by_text("served").first.wait_for(timeout=60_000)
        page.wait_for_timeout(2_000)  # where the UI goes by itself, it has gone by now
        return {"url": page.url, "served": page.get_by_text("served").first.is_visible()}
    finally:
        page.close()


def _shown_image_width(browser, url: str) -> int:
    """The width of the image MLflow's artifact view draws for the file at ``url`` (it loads
    the file into a blob: URL), on a page of its own: 0 if the browser could not draw it."""
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    try:
        page.goto(url)
        shown = (
            "() => Array.from(document.images).some(i => i.src.startsWith('blob:') && i.complete)"
        )
        page.wait_for_function(shown, timeout=60_000)
        return page.evaluate(
            "() => Array.from(document.images).find(i => i.src.startsWith('blob:')).naturalWidth"
        )
    finally:
        page.close()
