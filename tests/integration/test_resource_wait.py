"""A run on a cluster whose CPUs other work holds: Ray Train's placement of the workers waits,
and the command says so — what the run needs and what the cluster has free — until the CPUs
are free; then the run trains as usual. On the shared Ray, an actor holds every CPU until the
command has said twice that it waits (the first line, and the next one ``EVERY_S`` later); a
restart after a failure that waits is said the same way."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests import faults
from tests.conftest import RECIPES
from trainforge.cli import main as cli_main
from trainforge.driver import resource_wait

pytestmark = pytest.mark.ray

DIGITS = RECIPES / "cnn" / "digits_simple_cnn.yaml"


class Holder:
    """An actor that takes every CPU of the cluster (``ray.remote(num_cpus=…)`` at its start)."""

    def ready(self) -> bool:
        return True


def count_wait_lines(
    monkeypatch: pytest.MonkeyPatch, restart_only: bool = False
) -> threading.Semaphore:
    """A semaphore released each time the command says that its workers wait (with
    ``restart_only``, only a restart's line counts)."""
    said = threading.Semaphore(0)
    describe = resource_wait.describe

    def describe_and_count(*args: Any, restart: bool = False) -> str:
        if restart or not restart_only:
            said.release()
        return describe(*args, restart=restart)

    monkeypatch.setattr(resource_wait, "describe", describe_and_count)
    return said


def release_after_two_lines(ray: Any, holder: Any, said: threading.Semaphore) -> None:
    """The first line, and the one EVERY_S later; then the CPUs are freed."""
    for _ in range(2):
        if not said.acquire(timeout=120):
            break  # never said: the CPUs are freed all the same, and the test fails
    ray.kill(holder)


def wait_lines(out: str, cpus: int, restart: bool = False) -> tuple[list[str], list[int]]:
    """The command's lines and where it said that the workers wait: at least twice, each line
    exactly as ``describe`` words it."""
    lines = out.splitlines()
    waiting = [i for i, line in enumerate(lines) if "workers: waiting for resources" in line]
    assert len(waiting) >= 2, out[-3000:]
    kind = " to restart" if restart else ""
    for i in waiting:
        assert re.fullmatch(
            rf"\[trainforge\] workers: waiting for resources{kind}: the run needs 2 CPU; "
            rf"the cluster has 0 of {cpus} CPU free \(\d+ s\)",
            lines[i],
        ), lines[i]
    return lines, waiting


def test_workers_waiting_for_cpus_are_said_then_train(
    ray_cluster, in_tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ray = ray_cluster
    monkeypatch.setattr(resource_wait, "FIRST_S", 1.0)
    monkeypatch.setattr(resource_wait, "EVERY_S", 2.0)
    cpus = int(ray.cluster_resources()["CPU"])

    holder = ray.remote(num_cpus=cpus)(Holder).remote()
    assert ray.get(holder.ready.remote(), timeout=120)
    said = count_wait_lines(monkeypatch)
    release = threading.Thread(
        target=release_after_two_lines, args=(ray, holder, said), daemon=True
    )
    release.start()
    code = cli_main(["train", str(DIGITS), "run.name=waited", "scaling.num_workers=2",
                     "train.epochs=1", "tracking.enabled=false"])  # fmt: skip
    release.join()
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    lines, waiting = wait_lines(out, cpus)
    started = next(i for i, line in enumerate(lines) if "process group up" in line)
    assert max(waiting) < started  # said while the workers waited, not after they started
    assert "finished at step 22 " in out


def test_a_restart_waiting_for_cpus_is_said(
    ray_cluster, in_tmp: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The workers fail after epoch 1 (``run.max_failures=1``). While they train, an actor asks
    for every CPU and waits; the failed group's CPUs go to it, so the restart's group waits,
    and the command says so, as a restart's, until the actor is gone; then the run resumes."""
    ray = ray_cluster
    monkeypatch.setattr(resource_wait, "FIRST_S", 1.0)
    monkeypatch.setattr(resource_wait, "EVERY_S", 2.0)
    monkeypatch.setattr(resource_wait, "PLACED_POLL_S", 0.5)
    faults.ask(monkeypatch, **{faults.FAIL_AFTER_EPOCH: "1"})
    cpus = int(ray.cluster_resources()["CPU"])
    job = ray.get_runtime_context().get_job_id()

    said = count_wait_lines(monkeypatch, restart_only=True)

    def hold_while_the_restart_waits() -> None:
        deadline = time.monotonic() + 120
        while not resource_wait.placed(ray.util.placement_group_table(), job):
            if time.monotonic() > deadline:
                return  # never placed: the run fails the test
            time.sleep(0.2)
        # it waits: the workers hold the CPUs; the failed group's go to it
        release_after_two_lines(ray, ray.remote(num_cpus=cpus)(Holder).remote(), said)

    hold = threading.Thread(target=hold_while_the_restart_waits, daemon=True)
    hold.start()
    code = cli_main(["train", str(DIGITS), "run.name=rewaited", "scaling.num_workers=2",
                     "train.epochs=2", "run.max_failures=1", "tracking.enabled=false"])  # fmt: skip
    hold.join()
    out = capsys.readouterr().out
    assert code == 0, out[-3000:]
    lines, waiting = wait_lines(out, cpus, restart=True)
    restarted = next(i for i, line in enumerate(lines) if "workers restarted (1 so far" in line)
    assert max(waiting) < restarted  # said while the restart waited
    assert "finished at step 44 " in out
