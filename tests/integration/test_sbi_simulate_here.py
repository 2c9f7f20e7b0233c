"""The simulation stage made by a process of the command's own (``simulate.make_here``, started
by the driver's stage runner, ``driver/stage.py``), without a Ray cluster: the same chunks as
the cluster's stage makes, a manifest that says where, an interrupted process that leaves whole
chunks only and a stage that resumes from them, and a user's simulator failing there as one
recipe error."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
import torch

from tests.conftest import RECIPES
from trainforge import config
from trainforge.driver import stage
from trainforge.errors import RecipeError
from trainforge.workloads.sbi import simulate, simulating, simulations

pytestmark = pytest.mark.slow

DEBUG = RECIPES / "sbi" / "two_moons_debug.yaml"


def _section(*overrides: str) -> object:
    return config.load(DEBUG, list(overrides)).workload


@pytest.fixture
def runner() -> stage.Runner:
    """The command's stage runner (one per command: it knows what this command started)."""
    return stage.Runner()


def test_small_simulations_are_made_here_while_the_cluster_would_start(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], runner: stage.Runner
) -> None:
    section = _section("workload.simulation.num_simulations=1200",
                       "workload.simulation.chunk_size=400")  # fmt: skip
    assert simulate.simulates_here(section)  # two_moons, 1,200: auto makes it here
    simulate.start_early(section, 0, str(in_tmp / "runs"), runner)
    folder = simulate.run(section, 0, str(in_tmp / "runs"), runner)

    manifest = simulations.read_manifest(folder)
    assert (manifest["chunks"], manifest["device"], manifest["invalid"]) == (3, "cpu", 0)
    # made on this machine by one process, not on a Ray node (those are named by node id)
    assert manifest["ran_on"] == {socket.gethostname(): {"processes": 1, "simulations": 1200}}
    # the chunks the cluster's CPU stage would make: the same seeds, the same rows
    for index in range(3):
        theta, x = simulations.read_chunk(simulations.chunk_file(folder, index))
        alone = simulating.simulate_chunk(section, 0, index, 400, "cpu")
        assert torch.equal(theta, alone["theta"]) and torch.equal(x, alone["x"])
    assert not list(folder.glob(".*.tmp"))

    out = capsys.readouterr().out
    assert "simulations: 1,200 two_moons simulations on this machine's CPU (begun before the " \
           "workers started)" in out  # fmt: skip
    assert "simulations: 1,200 in " in out and "by this command's own process" in out
    assert simulate.run(section, 0, str(in_tmp / "runs"), runner) == folder
    assert "simulations: reusing " in capsys.readouterr().out


def test_simulations_made_while_ray_started_are_this_commands_not_resumed(
    in_tmp: Path, capsys: pytest.CaptureFixture[str], runner: stage.Runner
) -> None:
    # A slow Ray start (15 s on a 2-core machine): the early process is done before the stage
    # looks. The lines said "0 two_moons simulations ... (resuming: 1,200 done)" and "0 in
    # 16.8 s", the seconds counted up to the stage's look.
    section = _section("workload.simulation.num_simulations=1200",
                       "workload.simulation.chunk_size=400")  # fmt: skip
    started = time.time()
    simulate.start_early(section, 0, str(in_tmp / "runs"), runner)
    (folder,) = (in_tmp / "runs" / "simulations").iterdir()
    deadline = time.monotonic() + 120
    while not (folder / simulations.MANIFEST).is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    done_after = time.time() - started
    time.sleep(2.0)  # Ray still starting
    simulate.run(section, 0, str(in_tmp / "runs"), runner)

    out = capsys.readouterr().out
    assert "simulations: 1,200 two_moons simulations on this machine's CPU (begun before the " \
           "workers started)" in out  # fmt: skip
    assert "resuming" not in out
    (line,) = [x for x in out.splitlines() if "by this command's own process" in x]
    seconds = float(line.split("simulations: 1,200 in ")[1].split(" s ")[0])
    assert seconds <= done_after + 0.1  # its own time, not the wait's


def test_an_interrupted_process_leaves_whole_chunks_and_the_stage_resumes(
    in_tmp: Path, runner: stage.Runner
) -> None:
    section = _section("workload.task=bernoulli_glm", "workload.simulation.where=here",
                       "workload.simulation.num_simulations=600000",
                       "workload.simulation.chunk_size=10000")  # fmt: skip
    root = str(in_tmp / "runs")
    simulate.start_early(section, 0, root, runner)
    (folder,) = (in_tmp / "runs" / "simulations").iterdir()
    deadline = time.monotonic() + 120
    while not list(folder.glob("chunk-*.pt")) and time.monotonic() < deadline:
        time.sleep(0.01)
    stage._end(str(folder))  # what a Ctrl-C of the command does to it

    chunks = {c.name: c.stat().st_mtime_ns for c in folder.glob("chunk-*.pt")}
    assert 0 < len(chunks) < 60, len(chunks)  # ended part way
    assert not (folder / simulations.MANIFEST).exists()
    assert not list(folder.glob(".*.tmp"))  # the file it was writing went with it
    for name in chunks:  # each one whole
        theta, x = simulations.read_chunk(folder / name)
        assert theta.shape == (10000, 10) and x.shape == (10000, 10)

    assert simulate.run(section, 0, root, runner, quiet=True) == folder
    assert simulations.read_manifest(folder)["chunks"] == 60
    assert len(list(folder.glob("chunk-*.pt"))) == 60
    # the chunks made before the interruption were kept, not made again
    assert {n: (folder / n).stat().st_mtime_ns for n in chunks} == chunks


BROKEN = """
import torch

prior = torch.distributions.Independent(
    torch.distributions.Uniform(torch.zeros(2), torch.ones(2)), 1
)


def simulate(theta):
    # right for the driver's probe of two rows, wrong for a chunk
    return theta if len(theta) <= 2 else theta[:, :1]
"""


def test_a_users_simulator_failing_here_is_one_recipe_error(
    in_tmp: Path, runner: stage.Runner
) -> None:
    (in_tmp / "broken_sim.py").write_text(BROKEN)
    section = _section("workload.task=custom", "workload.prior=broken_sim:prior",
                       "workload.simulator=broken_sim:simulate", "workload.vectorized=true",
                       "workload.simulation.where=here",
                       "workload.simulation.num_simulations=400")  # fmt: skip
    with pytest.raises(RecipeError, match=r"^workload.simulator: returned shape \[400, 1\]"):
        simulate.run(section, 0, str(in_tmp / "runs"), runner, quiet=True)
    (folder,) = (in_tmp / "runs" / "simulations").iterdir()
    assert not list(folder.glob("chunk-*")) and not (folder / simulations.MANIFEST).exists()
