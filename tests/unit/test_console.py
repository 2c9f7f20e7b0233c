"""The driver's console (``trainforge.driver.console``): which relayed worker lines reach the
user, what is kept in the run's worker-output.log, rank 0's progress events as plain lines or
as a bar in a terminal, and the closing summary. The bar on a real terminal's screen:
test_console_terminal.py."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from trainforge import log, progress_events, ray_compat
from trainforge.checkpoint import Position
from trainforge.distributed import WorkerContext
from trainforge.driver import console
from trainforge.driver.console import Console
from trainforge.progress import Progress

STEP = "epoch 1/2 step 5/10 loss 0.5000 lr 1.00e-03 1,234 samples/s 12.3 ms/step eta 0:00:01"
# the event rank 0 writes for that step (progress.py)
STEP_EVENT = progress_events.line(
    "step", epoch=1, epochs=2, step=5, total=10, loss=0.5, lr=1e-3, samples_per_s=1234.0,
    step_ms=12.3, eta_s=1.0, eta_bound=False,
)  # fmt: skip
REPORT = "Reporting training result 1: TrainingReport(checkpoint=None, metrics={'loss': 0.5})"
CORE = (
    "[2026-11-26 15:41:54,683 E 27545 27575] core_worker.cc:2465: Actor with class name: "
    "'PreemptionWatcher' and ID: '5f1' has constructor arguments in the object store"
)
MLFLOW_INFO = (
    "2026/11/26 15:41:59 INFO mlflow.system_metrics.system_metrics_monitor: "
    "Started monitoring system metrics."
)

# seen on a 4-core GPU host with four commands starting at once: harmless, kept, not shown
LATE_AGENT = (
    "[2026-11-27 09:41:12,619 E 1220 1220] (raylet) main.cc:1108: Failed to establish connection "
    "to the metrics exporter agent. Metrics will not be exported. Exporter agent status: "
    "RpcError: Running out of retries to initialize the metrics agent. rpc_code: 14"
)


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def normal_verbosity() -> Iterator[None]:
    log.set_verbosity(0)
    yield
    log.set_verbosity(0)


def batch(*lines: str, is_err: bool = False, pid: int | str = 123) -> dict[str, Any]:
    return {"lines": list(lines), "is_err": is_err, "pid": pid, "actor_name": "RayTrainWorker"}


def test_only_trainforge_lines_and_warnings_are_shown_but_all_is_kept(tmp_path: Path) -> None:
    out = io.StringIO()
    kept = tmp_path / "run" / "worker-output.log"
    shown = Console(kept, out)
    shown.handle(batch("[trainforge] training 10 steps over 2 epochs", REPORT, MLFLOW_INFO))
    shown.handle(batch(CORE, "x.py:3: UserWarning: careful", "plain stderr", is_err=True))
    shown.handle(batch("Resized autoscaler table", "1 node idle", pid="autoscaler"))
    shown.handle({"lines": ["worker killed: out of memory"], "is_err": True, "pid": "raylet"})
    shown.handle({"lines": [LATE_AGENT], "is_err": True, "pid": "raylet"})
    shown.close()
    assert out.getvalue().splitlines() == [
        "[trainforge] training 10 steps over 2 epochs",
        "x.py:3: UserWarning: careful",
        "(raylet) worker killed: out of memory",
    ]
    assert kept.read_text().splitlines() == [
        "(RayTrainWorker 123) [trainforge] training 10 steps over 2 epochs",
        f"(RayTrainWorker 123) {REPORT}",
        f"(RayTrainWorker 123) {MLFLOW_INFO}",
        f"(RayTrainWorker 123) {CORE}",
        "(RayTrainWorker 123) x.py:3: UserWarning: careful",
        "(RayTrainWorker 123) plain stderr",
        "(pid raylet) worker killed: out of memory",
        f"(pid raylet) {LATE_AGENT}",
    ]


def test_without_a_log_file_lines_are_still_filtered() -> None:
    out = io.StringIO()
    shown = Console(None, out)
    shown.handle(batch("[trainforge] hello", REPORT))
    shown.close()
    assert out.getvalue() == "[trainforge] hello\n"


@pytest.mark.parametrize("out", [io.StringIO(), Terminal()], ids=["plain", "terminal"])
def test_quiet_hides_progress_but_keeps_warnings(out: io.StringIO, tmp_path: Path) -> None:
    log.set_verbosity(-1)
    shown = Console(tmp_path / "worker-output.log", out)
    shown.handle(batch("[trainforge] training 10 steps over 2 epochs", STEP_EVENT))
    shown.handle(batch("[trainforge] warning: loss scale dropped", is_err=True))
    shown.close()
    # no progress line and, in a terminal, no bar either: only the warning
    assert out.getvalue() == "[trainforge] warning: loss scale dropped\n"
    assert len((tmp_path / "worker-output.log").read_text().splitlines()) == 3


def test_step_events_are_plain_lines_outside_a_terminal(tmp_path: Path) -> None:
    out = io.StringIO()
    kept = tmp_path / "worker-output.log"
    shown = Console(kept, out)
    shown.handle(batch(STEP_EVENT))
    shown.close()
    assert out.getvalue() == f"[trainforge] {STEP}\n"
    assert "\r" not in out.getvalue() and "\x1b" not in out.getvalue()
    # the run folder's log reads the same line, not the event
    assert kept.read_text() == f"(RayTrainWorker 123) [trainforge] {STEP}\n"


def test_step_events_become_one_bar_in_a_terminal(capsys: pytest.CaptureFixture) -> None:
    out = Terminal()
    shown = Console(None, out)
    shown.handle(batch(STEP_EVENT))
    drawn = out.getvalue()
    assert drawn.startswith("\r") and "\n" not in drawn  # drawn in place, not a line
    assert "epoch 1/2  50%|" in drawn and "| 5/10 [" in drawn and "loss 0.5000" in drawn
    assert STEP not in drawn and progress_events.MARK not in drawn
    second = STEP_EVENT.replace('"step": 5', '"step": 10')
    shown.handle(batch(second))
    assert "100%|" in out.getvalue()[len(drawn) :]
    # a line said while the bar is drawn: the bar cleared first, on its own line, the bar
    # drawn again below it
    before = len(out.getvalue())
    shown.handle(batch("[trainforge] epoch 1/2 done: train/loss 0.5000 val/loss 0.2500"))
    said = out.getvalue()[before:]
    done = "[trainforge] epoch 1/2 done: train/loss 0.5000 val/loss 0.2500\n"
    assert said.startswith("\r") and done in said and "| 10/10 [" in said.split(done)[1]
    before = len(out.getvalue())
    log.say("from the driver")  # the command's own lines (to stdout): the bar cleared first
    assert capsys.readouterr().out == "[trainforge] from the driver\n"
    cleared, redrawn = out.getvalue()[before:].rsplit("\r", 1)
    assert cleared.strip() == "" and "| 10/10 [" in redrawn
    shown.close()
    assert out.getvalue().endswith("\n")  # the bar's last frame stays, on a line of its own
    assert STEP not in out.getvalue()


def test_progress_events_are_drawn_as_progress_writes_them(capsys: pytest.CaptureFixture) -> None:
    ctx = WorkerContext(rank=0, local_rank=0, world_size=1, node_rank=0, device=torch.device("cpu"))
    for early_stopping in (False, True):
        lines = Progress(ctx, 100, 4, 64, {}, early_stopping)
        metrics = lines.step_metrics(Position(1, 10, 35), steps=5)
        lines.log_step(Position(1, 10, 35), {"train/loss": 0.5, "train/lr": 1e-3, **metrics})
        printed = capsys.readouterr().out
        assert printed.startswith(f"{progress_events.MARK} ") and printed.endswith("\n")
        plain = progress_events.as_text(printed.rstrip("\n"))
        assert plain.startswith("[trainforge] epoch 2/4 step 35/100 loss 0.5000 lr 1.00e-03 ")
        assert " eta ≤ " in plain if early_stopping else " eta 0:" in plain
        # and the console draws that very event as the bar in a terminal
        out = Terminal()
        Console(None, out).handle(batch(printed.rstrip("\n")))
        assert "epoch 2/4  35%|" in out.getvalue() and "| 35/100 [" in out.getvalue()
    assert progress_events.read("[trainforge] epoch 1/2 done: train/loss 0.5000") is None


def test_a_run_that_early_stopping_ends_shows_no_totals(capsys: pytest.CaptureFixture) -> None:
    """train.epochs: null: no "epoch 2/100000 step 35/43900000 … eta ≤ 1 day" any more."""
    ctx = WorkerContext(rank=0, local_rank=0, world_size=1, node_rank=0, device=torch.device("cpu"))
    lines = Progress(ctx, None, None, 64, {}, early_stopping=True)
    lines.start(Position(0, 0, 0))
    metrics = lines.step_metrics(Position(1, 10, 35), steps=5)
    lines.log_step(Position(1, 10, 35), {"train/loss": 0.5, "train/lr": 1e-3, **metrics})
    lines.log_epoch(1, {"val/loss": 0.25})
    written = capsys.readouterr().out.splitlines()
    printed = [progress_events.as_text(line) for line in written]
    assert printed[0].startswith(f"{log.PREFIX} training until early stopping ends the run on 1 ")
    step = printed[1][len(log.PREFIX) + 1 :]
    assert step.startswith("epoch 2 step 35 loss 0.5000 ") and step.endswith(" eta early stop")
    assert printed[2] == f"{log.PREFIX} epoch 2 done: val/loss 0.2500"
    event = progress_events.read(written[1])
    assert event is not None and (event["epochs"], event["total"]) == (None, None)
    out = Terminal()
    shown = Console(None, out)
    shown.handle(batch(written[1]))
    assert out.getvalue().startswith("\repoch 2 step 35 [")  # a bar without a total
    assert "%" not in out.getvalue() and "loss 0.5000" in out.getvalue()
    lines.finish(Position(3, 0, 40))  # early stopping ended it at step 40, no logging step
    shown.handle(batch(capsys.readouterr().out.rstrip("\n")))
    last_frame, finished = out.getvalue().rsplit("\r", 1)[-1].split("\n")[:2]
    assert last_frame.startswith("epoch 2 step 40 [") and "%" not in last_frame
    assert finished.startswith("[trainforge] finished at step 40 in ")


def test_summary_table(capsys: pytest.CaptureFixture) -> None:
    metrics = {
        "perf/samples_per_s": 12345.6,
        "val/accuracy": 0.9,
        "best/val_loss": 0.29,
        "train/loss": 0.25,
        "epoch": 2,
        "val/loss": 0.3,
        "perf/step_ms": 3.0,  # not one of the shown ones: in MLflow only
    }
    console.summary(
        "demo", metrics, "/runs/demo/checkpoint_000002", ("abc123", "https://user:pw@host:5000")
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("[trainforge] run 'demo' finished in ")
    rows = [
        re.split(r"\s{2,}", line.removeprefix("[trainforge]").strip(), maxsplit=1)
        for line in out[1:]
    ]
    assert [key for key, _ in rows] == [
        "epoch",
        "train/loss",
        "val/loss",
        "val/accuracy",
        "best/val_loss",
        "checkpoint",
        "mlflow run",
    ]
    values = dict(rows)
    assert values["epoch"] == "2" and values["train/loss"] == "0.2500"
    # the last window's rate is not the run's (said on the line above the table): MLflow's only
    assert "perf/samples_per_s" not in values
    assert values["checkpoint"] == "/runs/demo/checkpoint_000002"
    assert values["mlflow run"] == "abc123 at https://***@host:5000"
    text = "\n".join(out)
    assert "user:pw" not in text
    assert "trainforge ui" not in text  # a server: the user opens it themselves


def test_summary_shows_an_sbi_runs_scores_once_each(capsys: pytest.CaptureFixture) -> None:
    metrics = {
        "epoch": 40,
        "val/loss": -2.13,
        "c2st/obs10": 0.61,
        "c2st/obs2": 0.58,
        "c2st/mean": 0.595,
        "c2st/seconds": 5.9,  # how long, not how good: in MLflow only
        "sbc/ks_pvalue_dim0": 0.26,  # one per parameter: the smallest is shown
        "sbc/ks_pvalue_min": 0.26,
        "sbc/max_ecdf_deviation": 0.14,
    }
    console.summary("sbi", metrics, None, None)
    keys = [line.split()[1] for line in capsys.readouterr().out.splitlines()[1:]]
    assert keys == [
        "epoch",
        "val/loss",
        "c2st/mean",
        "sbc/ks_pvalue_min",
        "sbc/max_ecdf_deviation",
        "c2st/obs2",
        "c2st/obs10",
    ]
    one = {key: value for key, value in metrics.items() if key != "c2st/obs10"}
    console.summary("sbi", one, None, None)
    text = capsys.readouterr().out
    assert "c2st/mean" in text and "c2st/obs2" not in text  # the mean is its value


@pytest.mark.parametrize("uri", ["sqlite:///runs/mlflow.db", "postgresql://user:pw@db/mlflow"])
def test_summary_says_how_to_open_a_store(uri: str, capsys: pytest.CaptureFixture) -> None:
    log.set_verbosity(-1)  # the outcome is shown even under -q
    console.summary("demo", {"train/loss": 0.25}, None, ("abc123", uri))
    text = capsys.readouterr().out
    assert "run 'demo' finished" in text and "train/loss" in text
    assert "checkpoint" not in text
    assert "trainforge ui --tracking-uri " in text
    if "@" not in uri:
        assert f"trainforge ui --tracking-uri {uri}\n" in text
    assert "user:pw" not in text  # never the database password, not even in the hint


def test_the_late_metrics_agent_lines_are_dropped_from_any_printer() -> None:
    printed: list[dict[str, Any]] = []
    printer = ray_compat.without_late_metrics_agent(printed.append)
    gcs = (
        "gcs_server.cc:1361: Failed to establish connection to the event+metrics exporter "
        "agent. Events and metrics will not be exported."
    )
    core = (
        "core_worker_process.cc:842: Failed to establish connection to the metrics exporter "
        "agent. Metrics will not be exported."
    )
    printer({"lines": [LATE_AGENT], "pid": "raylet", "is_err": True})
    printer({"lines": [gcs], "pid": "gcs_server", "is_err": True})
    printer({"lines": [core, "simulating chunk 3"], "pid": 77, "is_err": False})
    assert printed == [{"lines": ["simulating chunk 3"], "pid": 77, "is_err": False}]


@pytest.mark.ray
def test_before_a_run_ray_prints_its_lines_less_the_late_metrics_agent(
    ray_cluster, capsys: pytest.CaptureFixture
) -> None:
    """What the driver shows between connecting and a run's console (the simulation stage):
    Ray's own printer, through the filter."""
    from ray._private import worker

    ray_compat.quiet_ray_printer()
    dispatcher = worker.global_worker_stdstream_dispatcher
    base = {"ip": "127.0.0.1", "job": "01000000", "task_name": "", "actor_name": ""}
    dispatcher.emit(base | {"pid": "raylet", "is_err": True, "lines": [LATE_AGENT]})
    dispatcher.emit(base | {"pid": 4242, "is_err": False, "lines": ["simulating chunk 3"]})
    printed = capsys.readouterr()
    assert "metrics exporter agent" not in printed.out + printed.err
    assert "simulating chunk 3" in printed.out


def test_under_verbose_the_line_file_shows_events_as_plain_lines(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """-v on the own and warm workers' path: every line as it comes, an event as its line."""
    lines = tmp_path / ".console-lines"
    lines.write_text(f"41\t0\t0\t{STEP_EVENT}\n41\t0\t0\t[trainforge] hello\n")
    console.relay_file(lines, None)()  # started, then stopped: what the file holds is shown
    assert capsys.readouterr().out.splitlines() == [
        f"(TrainforgeWorker pid=41, rank=0) [trainforge] {STEP}",
        "(TrainforgeWorker pid=41, rank=0) [trainforge] hello",
    ]


@pytest.mark.ray
def test_under_verbose_rays_printer_shows_events_as_plain_lines(
    ray_cluster, capsys: pytest.CaptureFixture
) -> None:
    """-v on Ray Train's path: Ray's own printer, each event as the line it stands for."""
    from ray._private import worker

    log.set_verbosity(1)
    assert console.attach(None) is None
    base = {"ip": "127.0.0.1", "job": "01000000", "task_name": "", "actor_name": "RayTrainWorker"}
    worker.global_worker_stdstream_dispatcher.emit(
        base | {"pid": 4242, "is_err": False, "lines": [STEP_EVENT, "plain"]}
    )
    printed = capsys.readouterr().out
    assert f"[trainforge] {STEP}\n" in printed and "plain\n" in printed
    assert progress_events.MARK not in printed
    ray_compat.quiet_ray_printer()  # as it was before the run
