"""Warm simulators (``driver/warm_pool.py``, ``worker/warm.py``): on the lasting local cluster a
custom simulator's stage runs in processes that outlive the command and serve the next one's
stage, never from an old import of the user's code, giving the same simulations as Ray's
tasks; one that dies mid-stage loses nothing. Real ``trainforge`` commands in a home of their
own (its own lasting cluster), as a user runs them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from tests.integration.test_local_cluster import env_for, run, trainforge, warm_workers
from trainforge.workloads.sbi import simulations

pytestmark = pytest.mark.ray

SIR = Path(__file__).resolve().parents[2] / "runtime" / "workloads" / "sbi" / "examples" / "sir.py"


SCALED = """
import os as _os

_shares = simulate


def simulate(theta):
    return _shares(theta) * float(_os.environ.get("MYSIM_SCALE", "1"))
"""


def recipe(n: int, cache: str = "sims") -> list[str]:
    """``trainforge simulate`` of the user's own copy of the SIR example (``mysim.py``)."""
    return ["simulate", "sir_custom", "workload.prior=mysim:prior",
            "workload.simulator=mysim:simulate", f"workload.simulation.num_simulations={n}",
            f"workload.simulation.cache_dir={cache}"]  # fmt: skip


def stage(folder: Path, n: int, cache: str = "sims") -> tuple[Path, set[int]]:
    """The cache entry of ``recipe(n, cache)`` and the pids of the processes that simulated it."""
    (entry,) = [e for e in (folder / cache).iterdir()
                if simulations.read_manifest(e)["num_simulations"] == n]  # fmt: skip
    chunks = simulations.read_manifest(entry)["chunks"]
    files = [simulations.chunk_file(entry, i) for i in range(chunks)]
    workers = [torch.load(f, weights_only=True)["worker"] for f in files]  # "node:pid"
    return entry, {int(worker.rsplit(":", 1)[1]) for worker in workers}


def launched(home: Path, folder: Path, n: int) -> subprocess.Popen[str]:
    """``recipe(n)`` started, read until its stage has begun (its simulators at work)."""
    process = subprocess.Popen(
        [*trainforge(), *recipe(n)], env=env_for(home), cwd=folder, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
    )  # fmt: skip
    assert process.stdout is not None
    for line in process.stdout:
        if " chunks of 16 to simulate for " in line:
            break
    deadline = time.monotonic() + 60
    while not any(
        json.loads(spec.read_text())["num_simulations"] == n and any(spec.parent.glob("chunk-*"))
        for spec in (folder / "sims").glob("*/spec.json")
    ):  # under way: a chunk is written
        assert process.poll() is None and time.monotonic() < deadline, "no chunk was written"
        time.sleep(0.05)
    return process


def same_simulations(one: Path, other: Path) -> bool:
    chunks = simulations.read_manifest(one)["chunks"]
    assert chunks == simulations.read_manifest(other)["chunks"]
    for i in range(chunks):
        mine = simulations.read_chunk(simulations.chunk_file(one, i))
        theirs = simulations.read_chunk(simulations.chunk_file(other, i))
        if not all(torch.equal(a, b) for a, b in zip(mine, theirs, strict=True)):
            return False
    return True


# Nine commands and a cluster start: ~56 s alone here
@pytest.mark.timeout(900)
def test_warm_simulators_serve_the_next_stage_and_never_an_old_import(
    home: Path, tmp_path: Path
) -> None:
    # the user's copy reads a variable of its own, as simulators that take settings do
    (tmp_path / "mysim.py").write_text(SIR.read_text() + SCALED)

    first = run(home, *recipe(400), cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "on 2 CPUs (starting 2; they stay warm for later commands) →" in first.stdout
    _, started = stage(tmp_path, 400)
    assert len(started) == 2

    # started by the first command, they see this one's environment
    second = run(home, *recipe(401), cwd=tmp_path, MYSIM_SCALE="1000")
    assert second.returncode == 0, second.stdout + second.stderr
    assert "on 2 CPUs (2 warm simulators) →" in second.stdout
    warm_entry, served = stage(tmp_path, 401)
    assert served == started  # the same two processes, no new ones
    assert simulations.load(warm_entry, drop_invalid=True)[1].max() > 1  # shares, times 1000

    status = run(home, "cluster", "status", cwd=tmp_path)
    assert "[trainforge] warm simulators: 2" in status.stdout, status.stdout
    assert "[trainforge] warm workers: none" in status.stdout

    # the same stage on Ray's tasks (new worker processes of this command): the same data
    cold = run(home, *recipe(401, "cold"), cwd=tmp_path, TRAINFORGE_WORKERS="ray-train",
               MYSIM_SCALE="1000")  # fmt: skip
    assert cold.returncode == 0, cold.stdout + cold.stderr
    assert "on 2 CPUs →" in cold.stdout
    cold_entry, ray_workers = stage(tmp_path, 401, "cold")
    assert not ray_workers & started
    assert same_simulations(warm_entry, cold_entry)

    # the user edits the simulator: never run from the old import
    with open(tmp_path / "mysim.py", "a") as module:
        module.write("\n# edited\n")
    edited = run(home, *recipe(402), cwd=tmp_path)
    assert edited.returncode == 0, edited.stdout + edited.stderr
    assert (
        "(starting 2; they stay warm for later commands, 2 replaced: module mysim changed on disk)"
        in edited.stdout
    )
    _, replacements = stage(tmp_path, 402)
    assert len(replacements) == 2 and not replacements & started

    # one of them killed mid-stage: its chunks go to the other, nothing is lost
    process = launched(home, tmp_path, 3000)
    os.kill(min(replacements), signal.SIGKILL)
    assert process.stdout is not None
    console = process.stdout.read()
    assert process.wait(timeout=120) == 0, console
    assert "simulations: a warm simulator ended; its chunks go to the others" in console
    entry, finished_by = stage(tmp_path, 3000)
    assert max(replacements) in finished_by
    _, x = simulations.load(entry, drop_invalid=True)
    assert len(x) + simulations.read_manifest(entry)["invalid"] == 3000  # every chunk is there

    # the same stage started twice at once (a sweep's runs of one recipe): the second waits
    # for the first and reuses its simulations, where both used to make them all
    process = launched(home, tmp_path, 10_000)
    together = run(home, *recipe(10_000), cwd=tmp_path)
    assert process.stdout is not None
    console = process.stdout.read()
    assert process.wait(timeout=120) == 0, console
    assert together.returncode == 0, together.stdout + together.stderr
    waited = f"simulations: another command (pid {process.pid}) is making these; waiting for it"
    assert waited in together.stdout, together.stdout
    assert "simulations: reusing" in together.stdout
    assert " to simulate for " not in together.stdout  # it simulated nothing itself

    # the command killed mid-stage: its simulators stop simulating; the next command resumes
    process = launched(home, tmp_path, 3001)
    # busy with its chunks (polled: a written chunk's task may have ended, the next not begun)
    deadline = time.monotonic() + 30
    while not warm_workers(home, ".run_task", kind="WarmSimulator") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert warm_workers(home, ".run_task", kind="WarmSimulator")
    process.kill()
    process.wait(timeout=30)
    # each checks its command every second; on a loaded machine (the whole suite on 2 cores)
    # 15 s was once not enough
    deadline = time.monotonic() + 45
    while warm_workers(home, ".run_task", kind="WarmSimulator") and time.monotonic() < deadline:
        time.sleep(0.2)
    assert warm_workers(home, ".run_task", kind="WarmSimulator") == []
    again = run(home, *recipe(3001), cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "done)" in again.stdout and "(resuming: " in again.stdout, again.stdout
