"""Sequential rounds, the SBI family's part (``workloads/sbi/rounds.py``) and the stage's θ from a
proposal file: what a recipe of rounds may ask for, a proposal's rows simulated chunk by chunk
and addressed by their content, the next round's θ drawn from the prior truncated to a
posterior, and the rounds' simulations combined into one entry to train on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.unit.sbi_helpers import DEBUG, _data, assert_refused_before_launch, write_simulations
from trainforge import config
from trainforge.errors import RecipeError
from trainforge.workloads.sbi import catalogue, rounds, simulate, simulating, simulations
from trainforge.workloads.sbi.config import SBIWorkloadConfig
from trainforge.workloads.sbi.tasks import get_task

ROUNDS = "workload.rounds=2"
CUSTOM = "workload.task=custom workload.prior=m:p workload.simulator=m:s"
SMALL = "train.batch_size=4"  # a batch that 40 simulations fill


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ("workload.method=fmpe workload.estimator.model=mlp",
         "workload.rounds: method fmpe has no sequential rounds here; use one of npe, nle, nre, "
         "nre_c, or rounds: 1"),
        ("workload.evaluation.observations=[1,2]",
         "workload.evaluation.observations: sequential rounds (workload.rounds: 2) focus on one "
         "observation"),
        ("workload.ensemble=2",
         "workload.ensemble: an ensemble of sequential runs (workload.rounds: 2)"),
        ("workload.simulation.path=/tmp/x", "workload.simulation.path: sequential rounds "
                                            "(workload.rounds: 2) make each round's simulations"),
        ("workload.rounds=0", "workload.rounds: must be >= 1"),
        ("workload.evaluation.observed=x_o.npy", "workload.evaluation.observed: a custom task's "
                                                 "observed x; task two_moons names one of its"),
        (f"{CUSTOM} workload.evaluation.observations=[]", "workload.evaluation.observed: "
                                                         "sequential rounds (workload.rounds: 2) "
                                                         "of a custom task focus on an observed x"),
        (f"{CUSTOM} workload.evaluation.observed=x_o.csv",
         "workload.evaluation.observed: x_o.csv is neither a .pt nor a .npy file"),
    ],
)  # fmt: skip
def test_a_recipe_of_rounds_is_refused_what_rounds_cannot_do(overrides: str, message: str) -> None:
    with pytest.raises(RecipeError, match=re.escape(message)):
        config.load(DEBUG, [ROUNDS, *overrides.split()])


def test_an_observed_x_without_rounds_is_refused() -> None:
    with pytest.raises(RecipeError, match=re.escape(
            "workload.evaluation.observed: only sequential rounds use it; set workload.rounds "
            "above 1, or remove it")):  # fmt: skip
        config.load(DEBUG, [*CUSTOM.split(), "workload.evaluation.observed=x_o.pt"])


def test_a_custom_tasks_observed_x_is_read_from_a_pt_or_npy_file_as_one_row(
    tmp_path: Path,
) -> None:
    import numpy as np

    np.save(tmp_path / "x_o.npy", np.array([[0.5, -0.25, 2.0]]))
    torch.save(torch.tensor([0.5, -0.25, 2.0], dtype=torch.float64), tmp_path / "x_o.pt")
    for name in ("x_o.npy", "x_o.pt"):
        x = rounds.observed_x(str(tmp_path / name), 3)
        assert x.dtype == torch.float32 and torch.equal(x, torch.tensor([[0.5, -0.25, 2.0]]))
    torch.save({"x": torch.zeros(3)}, tmp_path / "dict.pt")
    torch.save(torch.tensor([1.0, float("nan"), 0.0]), tmp_path / "nan.pt")
    (tmp_path / "garbled.npy").write_bytes(b"not numpy")
    for name, message in [
        ("missing.npy", "does not exist"),
        ("x_o.npy", "holds 3 values of shape (1, 3); the simulator's x has 4"),
        ("dict.pt", "holds a dict, not one tensor"),
        ("nan.pt", "holds NaN or infinite values"),
        ("garbled.npy", "could not be read: "),
    ]:
        dim_x = 4 if name == "x_o.npy" else 3
        with pytest.raises(RecipeError, match=re.escape(message)) as refused:
            rounds.observed_x(str(tmp_path / name), dim_x)
        assert str(refused.value).startswith(f"workload.evaluation.observed: {tmp_path / name}")


def test_a_refused_recipe_of_rounds_is_one_line_before_anything_starts(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    npse = [ROUNDS, "workload.method=npse", "workload.estimator.model=mlp"]
    assert_refused_before_launch(DEBUG, npse,
                                 "workload.rounds: method npse has no sequential rounds",
                                 monkeypatch, capsys)  # fmt: skip


def _section(*overrides: str) -> SBIWorkloadConfig:
    section = config.load(DEBUG, list(overrides)).workload
    assert isinstance(section, SBIWorkloadConfig)
    return section


def test_a_proposals_rows_are_simulated_chunk_by_chunk_and_address_the_entry(
    tmp_path: Path,
) -> None:
    """Chunk i simulates rows i·rows … of the proposal file, from the chunk's own seed (so the
    same rows give the same x in any process); the cache key follows the file's content."""
    proposal = tmp_path / "proposal.pt"
    theta = torch.rand(40, 2) * 2 - 1
    torch.save(theta, proposal)
    cfg = _section(SMALL, "workload.simulation.num_simulations=40",
                   "workload.simulation.chunk_size=16",
                   f"workload.simulation.proposal={proposal}")  # fmt: skip
    chunks = [simulating.simulate_chunk(cfg, 7, i, n, "cpu") for i, n in ((0, 16), (1, 16), (2, 8))]
    assert torch.equal(torch.cat([c["theta"] for c in chunks]), theta)
    task = get_task("two_moons")
    generator = torch.Generator().manual_seed(simulating.chunk_seed(7, 1))
    assert torch.equal(chunks[1]["x"], task.simulate(theta[16:32], generator).float())

    facts = catalogue.builtin("two_moons")
    keyed = simulate.plan(cfg, facts, 7, tmp_path, "cpu").key
    from_prior = _section(SMALL, "workload.simulation.num_simulations=40",
                          "workload.simulation.chunk_size=16")  # fmt: skip
    assert simulate.plan(from_prior, facts, 7, tmp_path, "cpu").key != keyed
    torch.save(theta.flip(0), proposal)
    simulating._proposals.clear()  # a new process: the file read again
    assert simulate.plan(cfg, facts, 7, tmp_path, "cpu").key != keyed


def test_a_proposal_of_the_wrong_shape_is_one_line_naming_it(tmp_path: Path) -> None:
    proposal = tmp_path / "proposal.pt"
    torch.save(torch.zeros(30, 3), proposal)
    cfg = _section(SMALL, "workload.simulation.num_simulations=40",
                   f"workload.simulation.proposal={proposal}")  # fmt: skip
    with pytest.raises(RecipeError, match=re.escape(
            f"workload.simulation.proposal: {proposal} holds θ of shape [30, 3]; num_simulations "
            "and two_moons's θ want [40, 2]")):  # fmt: skip
        simulate.check_proposal(cfg, catalogue.builtin("two_moons"))


def test_the_next_rounds_theta_come_from_the_prior_truncated_to_the_posterior(
    tmp_path: Path,
) -> None:
    """NPE's next round: θ inside the prior, all within the posterior's high-density region at
    the observation (above the lowest log-probability of its threshold's quantile), drawn the
    same for the same seed; the line says how much of the prior the region keeps."""
    from trainforge.workloads.sbi import estimator as estimators
    from trainforge.workloads.sbi import export
    from trainforge.workloads.sbi.config import EstimatorSection

    theta, x = _data()
    record = estimators.BuildRecord.from_config(EstimatorSection(), 2, 2)
    estimator = estimators.build(record, theta, x)
    optimizer = torch.optim.Adam(estimator.parameters(), lr=5e-3)
    for _ in range(150):  # a posterior narrower than the prior's box
        optimizer.zero_grad()
        estimator.loss(theta, condition=x).mean().backward()
        optimizer.step()
    estimator.eval()
    previous = tmp_path / "run-r0"
    export.save_posterior(previous / "posterior.pt", estimator, record, {"task": "two_moons"})
    cfg = _section("workload.simulation.num_simulations=300",
                   "workload.evaluation.observations_from=own")  # fmt: skip
    said = rounds.propose(cfg, previous, 5, tmp_path / "p1.pt")
    assert re.fullmatch(
        r"300 θ from the prior truncated to round run-r0's posterior at "
        r"observation 1 \(it keeps \d+\.\d% of the prior; judged on the CPU\)",
        said,
    ), said
    drawn = torch.load(tmp_path / "p1.pt", weights_only=True)
    assert drawn.shape == (300, 2) and bool((drawn.abs() <= 1).all())
    rounds.propose(cfg, previous, 5, tmp_path / "p2.pt")
    assert torch.equal(torch.load(tmp_path / "p2.pt", weights_only=True), drawn)
    kept = float(said.split("keeps ")[1].split("%")[0])
    assert 0 < kept < 50  # two moons at one x: a small part of the box


def test_the_rounds_simulations_combine_into_one_entry_in_their_order(tmp_path: Path) -> None:
    first = write_simulations(tmp_path / "a", 30, 16)
    second = write_simulations(tmp_path / "b", 20, 16, nan_rows=1)
    out = rounds.training_data([first, second], tmp_path / "data-r1")
    manifest = simulations.read_manifest(out)
    assert (manifest["num_simulations"], manifest["chunks"], manifest["invalid"]) == (50, 4, 1)
    theta, x = simulations.load(out, drop_invalid=True)
    theta_a, x_a = simulations.load(first, drop_invalid=True)
    theta_b, x_b = simulations.load(second, drop_invalid=True)
    assert torch.equal(theta, torch.cat([theta_a, theta_b]))
    assert torch.equal(x, torch.cat([x_a, x_b]))
    written = (out / simulations.MANIFEST).stat().st_mtime_ns
    assert rounds.training_data([first, second], out) == out  # whole: kept as it is
    assert (out / simulations.MANIFEST).stat().st_mtime_ns == written


def test_the_python_api_trains_one_run_and_loads_a_finished_sequential_runs_folder(
    tmp_path: Path,
) -> None:
    """``trainforge.train`` refuses rounds (and an ensemble) in one line naming the command that
    runs them; ``trainforge.load`` of a command's folder that holds its recipe but no output yet
    (a sequential run stopped before its last round) says there is nothing to load."""
    import trainforge
    from trainforge.driver.child_runs import RECIPE_FILE

    for override, key in (
        (ROUNDS, "workload.rounds"),
        ("workload.ensemble=2", "workload.ensemble"),
    ):
        with pytest.raises(RecipeError, match=re.escape(f"{key}: ") + ".* through `trainforge "):
            trainforge.train("two_moons_debug", [override])
    folder = tmp_path / "runs" / "seq"
    folder.mkdir(parents=True)
    (folder / RECIPE_FILE).write_text(config.to_yaml(config.load(DEBUG, [ROUNDS])))
    with pytest.raises(RecipeError, match="no run folder with a valid checkpoint"):
        trainforge.load(folder)
