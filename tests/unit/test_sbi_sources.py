"""Simulation sources (``trainforge.workloads.sbi.sources``): user priors and simulators by
import path, their output checks, import failures that name the key, and the fingerprint that
follows the simulator's source."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from trainforge.errors import RecipeError
from trainforge.workloads.sbi import simulating, sources
from trainforge.workloads.sbi.config import SBIWorkloadConfig

USER_MODULE = """
import numpy as np
import torch

PRIOR = torch.distributions.Independent(
    torch.distributions.Uniform(-torch.ones(2), torch.ones(2)), 1
)

def prior():
    return PRIOR

def simulate(theta):
    return theta + 0.1 * torch.randn_like(theta)

def wrong_rows(theta):
    return torch.zeros(len(theta) + 1, 2)

def integers(theta):
    return torch.zeros(len(theta), 2, dtype=torch.int64)

def not_a_tensor(theta):
    return [1.0, 2.0]

def numpy_sim(theta):
    return np.asarray(theta) * 2.0

def numpy_noise(theta):
    return np.asarray(theta) + np.random.normal(size=np.shape(theta))

def broken(theta):
    raise RuntimeError("solver diverged")

NOT_CALLABLE = 3
"""


@pytest.fixture
def user_module(importable_module: Callable[[str, str], str]) -> str:
    return importable_module("user_sim", USER_MODULE)


def _custom(module: str, simulator: str, prior: str = "prior") -> SBIWorkloadConfig:
    return SBIWorkloadConfig(
        task="custom", prior=f"{module}:{prior}", simulator=f"{module}:{simulator}"
    )


def test_a_user_simulator_resolves(user_module: str) -> None:
    source = sources.resolve(_custom(user_module, "simulate"))
    assert (source.dim_theta, source.dim_x) == (2, 2)
    generator = torch.Generator().manual_seed(0)
    theta = source.sample_prior(10, generator)
    assert source.simulate(theta, generator).shape == (10, 2)
    assert source.fingerprint["simulator"] == f"{user_module}:simulate"
    numpy_source = sources.resolve(_custom(user_module, "numpy_sim"))
    assert numpy_source.simulate(theta, generator).dtype == torch.float32


def test_a_posterior_samples_on_the_gpu_only_where_its_prior_can_follow(user_module: str) -> None:
    """A built-in task's prior is rebuilt on the training device; a user's prior is an object
    made on the CPU, so its posterior samples there (evaluate.run asks posterior_device)."""
    gpu = torch.device("cuda", 0)  # only named: nothing is placed on it here
    assert sources.resolve(SBIWorkloadConfig(task="two_moons")).posterior_device(gpu) == gpu
    user = sources.resolve(_custom(user_module, "simulate"))
    assert user.posterior_device(gpu) == torch.device("cpu")
    assert user.prior_distribution("cpu") is user.prior
    with pytest.raises(ValueError, match="a user's prior lives on the CPU, not cuda"):
        user.prior_distribution(gpu)


@pytest.mark.parametrize(
    ("simulator", "prior", "message"),
    [
        ("wrong_rows", "prior", "returned shape [3, 2] for 2 parameter sets"),
        ("integers", "prior", "dtype torch.int64; need a floating dtype"),
        ("not_a_tensor", "prior", "returned list; it must return a torch tensor or numpy array"),
        ("broken", "prior", "failed on 2 prior draws: RuntimeError: solver diverged"),
        ("NOT_CALLABLE", "prior", "is not callable"),
        ("missing", "prior", "has no 'missing'"),
        ("simulate", "NOT_CALLABLE", "is int, not a torch Distribution"),
    ],
)
def test_bad_user_simulators_get_one_clear_error(
    user_module: str, simulator: str, prior: str, message: str
) -> None:
    with pytest.raises(sources.SimulatorError, match=re.escape(message)):
        sources.resolve(_custom(user_module, simulator, prior))


def test_import_failures_name_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    cfg = _custom("no_such_module_here", "simulate")
    with pytest.raises(
        RecipeError, match=r"workload\.prior: cannot import module 'no_such_module_"
    ) as missing:
        sources.resolve(cfg)
    # a module that is not there: where it was looked for, and what to do
    assert f"searched the current folder, {tmp_path}, and the Python path" in str(missing.value)
    (tmp_path / "sim_needing_a_package.py").write_text("import no_such_dependency_xyz\n")
    with pytest.raises(RecipeError, match="No module named 'no_such_dependency_xyz'") as inside:
        sources.resolve(_custom("sim_needing_a_package", "simulate"))
    assert "searched" not in str(inside.value)  # the module was found: its import failed
    sys.modules.pop("sim_needing_a_package", None)
    cfg.prior = "just_a_name"
    with pytest.raises(RecipeError, match=r"is not an import path like 'my_pkg\.module:name'"):
        sources.resolve(cfg)
    cfg.prior = None
    with pytest.raises(RecipeError, match="needs both prior and simulator"):
        sources.resolve(cfg)


def test_the_fingerprint_follows_the_simulators_source(user_module: str, tmp_path: Path) -> None:
    before = sources.resolve(_custom(user_module, "simulate")).fingerprint
    (tmp_path / f"{user_module}.py").write_text(USER_MODULE.replace("0.1 *", "0.2 *"))
    sys.modules.pop(user_module)
    after = sources.resolve(_custom(user_module, "simulate")).fingerprint
    assert before["simulator_source"] != after["simulator_source"]
    assert before["prior_source"] == after["prior_source"]  # the prior function is unchanged


def test_a_chunk_is_decided_by_its_seed_through_the_global_generators(user_module: str) -> None:
    """A user's prior and simulator draw from torch's and NumPy's global generators, which the
    stage seeds per chunk: a chunk's θ and x are those of ``torch.manual_seed`` and
    ``np.random.seed`` with the chunk's seed, whatever was drawn before it (on the CPU the stage
    seeds torch's CPU generator alone, the one these draws come from)."""

    cfg = _custom(user_module, "simulate")
    source = sources.resolve(cfg)  # its probe draws too: before the seeds
    seed = simulating.chunk_seed(7, 3)
    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    theta = source.sample_prior(16, torch.Generator())
    x = source.simulate(theta, torch.Generator())
    for _ in range(2):
        torch.rand(5), np.random.rand(5)  # other draws before the chunk change nothing
        chunk = simulating.simulate_chunk(cfg, 7, 3, 16, "cpu")
        assert torch.equal(chunk["theta"], theta) and torch.equal(chunk["x"], x)
    other = simulating.simulate_chunk(cfg, 7, 4, 16, "cpu")
    assert not torch.equal(other["theta"], theta)


def test_a_tasks_chunks_cross_as_one_tensor_and_come_back_apart(user_module: str) -> None:
    """A task returns its chunks' θ and x as one tensor each; each chunk comes back equal to
    its own result, holding only its own rows (``torch.save`` writes a view's whole storage,
    so a slice of the task's tensor would put every chunk into each chunk's file)."""

    cfg = _custom(user_module, "simulate")
    alone = [simulating.simulate_chunk(cfg, 7, i, n, "cpu") for i, n in ((0, 16), (1, 16), (2, 5))]
    packed = simulating.pack([dict(chunk) for chunk in alone])
    assert packed["theta"].shape[0] == 37 and packed["rows"] == [16, 16, 5]
    back = simulating.unpack(packed, "node:1")  # where the stage runner says it ran
    for chunk, mine in zip(alone, back, strict=True):
        assert torch.equal(mine["theta"], chunk["theta"]) and torch.equal(mine["x"], chunk["x"])
        assert mine["x"].untyped_storage().nbytes() == mine["x"].numel() * 4
        assert mine["worker"] == "node:1" and mine["invalid"] == chunk["invalid"]


@pytest.mark.parametrize("simulator", ["simulate", "numpy_noise"])
def test_a_tasks_chunks_drawn_together_equal_each_chunk_alone(
    user_module: str, simulator: str
) -> None:
    """On the CPU a task draws all its chunks' θ before it simulates any: each chunk's x still
    continues from its own seed and prior draw (torch's global RNG for ``simulate``, NumPy's
    for ``numpy_noise``), so a chunk's values do not depend on the task that ran it."""

    cfg = _custom(user_module, simulator)
    chunks = [(3, 16), (4, 16), (9, 7)]
    together = simulating.simulate_chunk_list(cfg, 7, chunks, "cpu")
    for (index, size), chunk in zip(chunks, together, strict=True):
        alone = simulating.simulate_chunk(cfg, 7, index, size, "cpu")
        assert torch.equal(chunk["theta"], alone["theta"]) and torch.equal(chunk["x"], alone["x"])
    assert not torch.equal(together[0]["x"], together[1]["x"])
