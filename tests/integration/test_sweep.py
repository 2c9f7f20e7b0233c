"""`trainforge sweep` (``driver/sweep.py``) as a user runs it, on a home's lasting local
cluster and its warm workers: trials searched and stopped early on Ray Tune, each a whole run
nested under the sweep's MLflow run; a trial that fails is recorded with its reason while the
sweep goes on; a sweep SIGKILLed mid-trial and run again keeps its finished trials, resumes the
interrupted one from its checkpoint and completes the rest, in one MLflow parent run."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests import faults
from tests.integration.test_local_cluster import env_for, trainforge

pytestmark = [pytest.mark.ray, pytest.mark.slow]

DIGITS = ["cnn/digits_simple_cnn", "run.name=sw", "checkpoint.every_epochs=1"]
BROKEN_MODEL = """
def build(num_classes):
    raise RuntimeError("this model is broken on purpose")
"""


def _sweep(home: Path, folder: Path, *arguments: str, env: dict[str, str] | None = None):
    return subprocess.run(
        [*trainforge(), "sweep", *DIGITS, *arguments], cwd=folder,
        env={**env_for(home), **(env or {})}, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def _trials(folder: Path) -> dict[str, dict[str, str]]:
    with open(folder / "runs" / "sw" / "trials.csv") as stream:
        return {row["trial"]: row for row in csv.DictReader(stream)}


def _runs(folder: Path) -> dict[str, list]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("trainforge")
    found: dict[str, list] = {}
    for run in client.search_runs([experiment.experiment_id]):
        found.setdefault(run.info.run_name, []).append(run)
    return found


def test_a_sweep_runs_whole_trials_nested_under_its_mlflow_run_past_a_failing_one(
    home: Path, in_tmp: Path
) -> None:
    (in_tmp / "broken_models.py").write_text(BROKEN_MODEL)
    done = _sweep(home, in_tmp, "train.epochs=2", "sweep.search=random", "--trials", "4",
                  "sweep.space.train.lr=loguniform(1e-3, 3e-2)",
                  "sweep.space.workload.model=choice(simple_cnn, broken_models:build)")  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    space = "train.lr loguniform(0.001, 0.03), workload.model choice(simple_cnn, " \
            "broken_models:build)"  # fmt: skip
    assert f"sweep 'sw': 4 trials of {space}; random search, asha on val/loss (min)" in out
    trials = _trials(in_tmp)
    assert sorted(trials) == ["sw-t1", "sw-t2", "sw-t3", "sw-t4"]
    for name, row in trials.items():  # the broken model's trials fail, the others train
        assert (row["state"] == "failed") == (row["workload.model"] == "broken_models:build")
        label = name.rsplit("-", 1)[1]
        assert f"sweep: {label} started: train.lr=" in out
        if row["state"] == "failed":
            assert "broken on purpose" in row["reason"]
            assert f"sweep: {label} failed: " in done.stderr
            assert (in_tmp / "runs" / "sw" / "trials" / f"{name}.log").is_file()
        else:
            assert row["state"] in ("finished", "stopped early") and float(row["val/loss"]) > 0
    states = {row["state"] for row in trials.values()}
    assert "failed" in states and "finished" in states  # the seed picks both models
    assert "sweep 'sw' ended in " in out and "best: sw-t" in out

    runs = _runs(in_tmp)
    parent = runs["sw"][0]
    assert parent.info.status == "FINISHED"
    best = parent.data.tags["sweep.best_trial"]
    assert trials[best]["state"] == "finished"
    assert parent.data.metrics["best/val/loss"] == pytest.approx(float(trials[best]["val/loss"]))
    trained = [n for n, row in trials.items() if row["state"] != "failed"]
    for name in trained:  # each a run of its own, nested under the sweep's
        (child,) = runs[name]
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert child.data.params["train.lr"] == trials[name]["train.lr"]
    assert runs[best][0].data.tags["trainforge.sweep.best"] == "true"
    stopped = [n for n, row in trials.items() if row["state"] == "stopped early"]
    assert stopped  # the seed's draws: asha stops one after its first epoch
    for name in stopped:  # its run ended finished, at the end of the epoch it was in
        (child,) = runs[name]
        assert child.info.status == "FINISHED"
        assert child.data.metrics["run/stopped_on_request"] == 1.0
        said = (in_tmp / "runs" / "sw" / "trials" / f"{name}.log").read_text()
        assert f"stopped after epoch {trials[name]['epochs']}: the sweep's scheduler " \
               f"stopped {name}" in said  # fmt: skip
    assert parent.data.tags["sweep.best_run_id"] == runs[best][0].info.run_id
    from mlflow.tracking import MlflowClient

    client = MlflowClient(f"sqlite:///{in_tmp / 'mlflow.db'}")
    logged = {a.path for a in client.list_artifacts(parent.info.run_id, "sweep")}
    assert logged == {"sweep/trials.csv", "sweep/metric_by_trial.png",
                      "sweep/parallel_coordinates.png"}  # fmt: skip
    # the MLflow UI lists the sweep, its trials' runs under it once it is expanded
    shown = _runs_shown_in_the_ui(in_tmp, expand="sw")
    assert "sw" in shown and not set(trained) & shown  # nested: folded under the sweep
    assert set(trained) <= _runs_shown_in_the_ui(in_tmp, expand="sw", click=True)


def test_a_sweep_killed_mid_trial_resumes_keeping_its_finished_trials(
    home: Path, in_tmp: Path
) -> None:
    arguments = ["train.epochs=6", "sweep.scheduler=fifo", "--trials", "3",
                 "sweep.space.train.lr=loguniform(1e-3, 3e-2)"]  # fmt: skip
    slow = faults.env({}, **{faults.SLOW_FROM_STEP: 1})  # an epoch lasts ~1 s longer
    command = [*trainforge(), "sweep", *DIGITS, *arguments]
    log = in_tmp / "first.log"
    with open(log, "w") as out:
        first = subprocess.Popen(command, cwd=in_tmp, env={**env_for(home), **slow},
                                 stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    t2_log = in_tmp / "runs" / "sw" / "trials" / "sw-t2.log"
    deadline = time.monotonic() + 600
    while not (t2_log.is_file() and "epoch 1/6 done" in t2_log.read_text()):
        assert first.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    first.send_signal(signal.SIGKILL)  # the sweep's command dies mid-trial, saying nothing
    first.wait()
    assert "t1 finished" in log.read_text()
    _no_trial_command_left(in_tmp)

    again = _sweep(home, in_tmp, *arguments, env=slow)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "sweep 'sw': resuming" in again.stdout
    assert "t1 started" not in again.stdout  # finished: kept
    assert ", resuming at epoch " in t2_log.read_text()  # from its checkpoint, not afresh
    trials = _trials(in_tmp)
    assert {name: row["state"] for name, row in trials.items()} == {
        "sw-t1": "finished", "sw-t2": "finished", "sw-t3": "finished"}  # fmt: skip
    # another space is another sweep: refused before anything starts
    other = _sweep(home, in_tmp, *arguments[:-1], "sweep.space.train.lr=loguniform(1e-4, 1e-2)")
    assert other.returncode == 2
    assert "sweep.space.train.lr 'loguniform(1e-3, 3e-2)' -> 'loguniform(1e-4, 1e-2)'" \
        in other.stderr  # fmt: skip
    assert "ray:" not in other.stdout

    runs = _runs(in_tmp)
    assert len(runs["sw"]) == 1  # one parent, reopened
    for name in trials:  # one run per trial, the interrupted one reopened
        (child,) = runs[name]
        assert child.info.status == "FINISHED"
        assert child.data.tags["mlflow.parentRunId"] == runs["sw"][0].info.run_id


def _runs_shown_in_the_ui(folder: Path, expand: str, click: bool = False) -> set[str]:
    """The run names the MLflow UI (`trainforge ui` on ``folder``'s store, in headless
    Chromium) shows in the experiment's runs table, after clicking the expander of the run
    ``expand`` where ``click``."""
    from playwright.sync_api import sync_playwright

    from tests.browser import CHROMIUM, CHROMIUM_FLAGS
    from tests.integration.mlflow_server import answers, free_port

    port = free_port()
    ui = subprocess.Popen([*trainforge(), "ui", "--port", str(port)], cwd=folder,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          start_new_session=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not answers(f"http://127.0.0.1:{port}/health"):
            assert ui.poll() is None and time.monotonic() < deadline, (
                "`trainforge ui` never answered"
            )
            time.sleep(0.5)
        from mlflow.tracking import MlflowClient

        experiment = MlflowClient(f"http://127.0.0.1:{port}").get_experiment_by_name("trainforge")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_FLAGS)
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(f"http://127.0.0.1:{port}/#/experiments/{experiment.experiment_id}/runs")
            row = page.locator("[role=row]").filter(has=page.get_by_text(expand, exact=True))
            row.first.wait_for(timeout=60_000)
            if click:  # the run name cell's expander of nested runs
                row.first.locator("button[data-component-id*=runnamecellrenderer]").click()
                page.get_by_text(f"{expand}-t", exact=False).first.wait_for(timeout=30_000)
            names = page.locator("[role=row] a").all_inner_texts()
            browser.close()
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.communicate(timeout=30)
    return {name.strip() for name in names if name.strip()}


def _no_trial_command_left(folder: Path) -> None:
    """The trial's command ends with its trial (its Ray actor dies with the sweep's command)."""
    deadline = time.monotonic() + 60
    while True:
        left = [pid for pid in _pids_in(folder) if pid != os.getpid()]
        if not left:
            return
        assert time.monotonic() < deadline, f"trial commands still running: {left}"
        time.sleep(0.5)


def _pids_in(folder: Path) -> list[int]:
    """This user's `trainforge train` processes working in ``folder``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            line = (entry / "cmdline").read_bytes().split(b"\0")
            if b"trainforge" in line and b"train" in line and (entry / "cwd").resolve() == folder:
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_an_sbi_sweep_compares_a_score_measured_at_each_runs_end(home: Path, in_tmp: Path) -> None:
    # c2st/mean comes once, when a run has finished: the epochs' results without it are not
    # given to Tune (which refuses a result without the sweep's metric)
    done = subprocess.run(
        [*trainforge(), "sweep", "two_moons_debug", "run.name=sbi", "--trials", "1",
         "scaling.num_workers=1", "train.epochs=3", "workload.evaluation.sbc_runs=0",
         "workload.evaluation.num_samples=500", "sweep.scheduler=fifo",
         "sweep.metric=c2st/mean", "sweep.space.train.lr=loguniform(1e-4, 1e-2)"],
        cwd=in_tmp, env=env_for(home), capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    with open(in_tmp / "runs" / "sbi" / "trials.csv") as stream:
        (row,) = list(csv.DictReader(stream))
    assert row["state"] == "finished" and 0.5 <= float(row["c2st/mean"]) <= 1.0
    assert "sweep: t1 finished: c2st/mean " in done.stdout
