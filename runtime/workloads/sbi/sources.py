"""What an SBI recipe simulates: a built-in benchmark task, or a user's prior and simulator
named by import path (``my_pkg.sim:simulate``).

Both become one ``SimulationSource``: draw θ from the prior, simulate x, check the output, and
say what the source is (its fingerprint addresses the simulation cache). User code is checked
once on a two-row probe before anything is scheduled, so a wrong shape or dtype is one clear
error instead of a failed Ray task.

A simulator that is not vectorised is run as the per-sample code it is: when a call on a batch
raises, its rows are simulated again one at a time, and the rows that raise on their own get
NaN for x and are counted (``Failures``), like a solver that fails on some parameters. Breaking
the contract (shape, dtype) is never such a failure: it stops the run.
"""

from __future__ import annotations

import hashlib
import inspect
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from trainforge.errors import RecipeError, UserCodeError
from trainforge.log import first_line
from trainforge.workloads import user_code
from trainforge.workloads.sbi.catalogue import CUSTOM, KNOWN_TASKS  # noqa: F401 - theirs too
from trainforge.workloads.sbi.config import SBIWorkloadConfig
from trainforge.workloads.sbi.tasks import get_task
from trainforge.workloads.sbi.tasks.base import Task

PROBE_SEED = 0  # the probe's prior draws: the same ones at every check, not the RNG's state
PROBE_RETRIES = 16  # single draws tried when the first two fail (a failing region, not a bug)


class SimulatorError(UserCodeError):
    """The user's simulator or prior broke its contract (import, shape, dtype, values)."""


def import_object(path: str, key: str, code_dir: str | None = None) -> Any:
    """``package.module:name`` → the object, or a SimulatorError naming the recipe key."""
    return user_code.import_object(path, key, code_dir, SimulatorError)


def load_prior(path: str, code_dir: str | None = None) -> torch.distributions.Distribution:
    """The prior named by ``path``: a torch Distribution, or a function returning one."""
    prior = import_object(path, "workload.prior", code_dir)
    if not isinstance(prior, torch.distributions.Distribution) and callable(prior):
        prior = prior()
    if not isinstance(prior, torch.distributions.Distribution):
        raise SimulatorError(
            f"workload.prior: {path} is {type(prior).__name__}, not a torch Distribution "
            "(or a function returning one)"
        )
    return prior


def _source_digest(obj: Any) -> str:
    """Hash of the object's source code, so an edited simulator gets a fresh cache entry."""
    try:
        text = inspect.getsource(obj)
    except (OSError, TypeError):
        text = repr(obj)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class SimulationSource:
    name: str
    dim_theta: int
    dim_x: int
    vectorized: bool  # torch code that runs wherever θ lives (so possibly on a GPU)
    fingerprint: dict[str, Any] = field(default_factory=dict)
    task: Task | None = None
    prior: torch.distributions.Distribution | None = None
    simulator: Any = None

    def sample_prior(self, n: int, generator: torch.Generator) -> Tensor:
        if self.task is not None:
            return self.task.prior_sample(n, generator)
        assert self.prior is not None
        # torch distributions take no generator: the caller seeds the global RNG per chunk
        return self.prior.sample((n,)).to(generator.device, torch.float32)

    def simulate(self, theta: Tensor, generator: torch.Generator) -> Tensor:
        """x for each row of θ, float32, checked for shape (NaN/inf are counted by the caller);
        rows on which a per-sample simulator raised are NaN."""
        return self.simulate_recording(theta, generator)[0]

    def simulate_recording(
        self, theta: Tensor, generator: torch.Generator
    ) -> tuple[Tensor, Failures]:
        """``simulate``, and which rows raised (per-sample simulators; a vectorised one's
        exception propagates)."""
        if self.task is not None:
            return self.task.simulate(theta, generator), Failures()
        try:
            x = self.simulator(theta)
        except Exception:
            if self.vectorized:
                raise
            return self._row_by_row(theta)
        return check_simulator_output(x, len(theta), self.dim_x), Failures()

    def _row_by_row(self, theta: Tensor) -> tuple[Tensor, Failures]:
        """After a batch raised: each row alone (the RNG goes on from where the batch left
        it, so a chunk's seed still decides every value)."""
        x = torch.full((len(theta), self.dim_x), float("nan"))
        failures = Failures()
        for row in range(len(theta)):
            try:
                out = self.simulator(theta[row : row + 1])
            except Exception as exc:  # the user's code failing on these parameters
                failures.add(row, theta[row], exc)
                continue
            x[row] = check_simulator_output(out, 1, self.dim_x)[0]
        return x, failures

    def posterior_device(self, training_device: torch.device) -> torch.device:
        """Where this source's posterior samples: the training device for a built-in task,
        whose prior is rebuilt there; the CPU for a user's prior, a Distribution made on the
        CPU that torch has no way to move."""
        return training_device if self.task is not None else torch.device("cpu")

    def prior_distribution(
        self, device: torch.device | str = "cpu"
    ) -> torch.distributions.Distribution:
        if self.task is not None:
            return self.task.prior_distribution(device)
        assert self.prior is not None
        if torch.device(device).type != "cpu":
            raise ValueError(f"a user's prior lives on the CPU, not {device}")
        return self.prior


@dataclass
class Failures:
    """Rows of one simulator call that raised (their x is NaN), and the first one's error."""

    rows: list[int] = field(default_factory=list)
    first: str = ""

    def add(self, row: int, theta: Tensor, exc: Exception) -> None:
        if not self.rows:
            values = ", ".join(f"{v:.4g}" for v in theta.tolist())
            self.first = f"{type(exc).__name__}: {first_line(exc)} at θ = [{values}]"
        self.rows.append(row)


def check_simulator_output(x: Any, rows: int, dim_x: int | None) -> Tensor:
    key = "workload.simulator"
    if isinstance(x, np.ndarray):
        if not np.issubdtype(x.dtype, np.floating):
            raise SimulatorError(f"{key}: returned a numpy array of dtype {x.dtype}; need floats")
        x = torch.from_numpy(x)
    if not isinstance(x, Tensor):
        raise SimulatorError(
            f"{key}: returned {type(x).__name__}; it must return a torch tensor or numpy array"
        )
    if not x.is_floating_point():
        raise SimulatorError(f"{key}: returned a tensor of dtype {x.dtype}; need a floating dtype")
    if x.dim() != 2 or x.shape[0] != rows or (dim_x is not None and x.shape[1] != dim_x):
        want = f"[{rows}, {dim_x if dim_x is not None else 'dim_x'}]"
        raise SimulatorError(
            f"{key}: returned shape {list(x.shape)} for {rows} parameter sets; expected {want} "
            "(one row of x per row of theta)"
        )
    return x.to(torch.float32)


def resolve(cfg: SBIWorkloadConfig) -> SimulationSource:
    """The recipe's ``workload`` section → its SimulationSource (imports user code)."""
    if cfg.task != CUSTOM:
        task = get_task(cfg.task)
        return SimulationSource(
            name=task.name,
            dim_theta=task.dim_theta,
            dim_x=task.dim_x,
            vectorized=True,
            fingerprint=task.fingerprint(),
            task=task,
        )
    if cfg.prior is None or cfg.simulator is None:
        raise RecipeError(
            f"workload: task {CUSTOM} needs both prior and simulator as import paths, e.g. "
            "prior: my_pkg.sim:prior and simulator: my_pkg.sim:simulate"
        )
    prior = load_prior(cfg.prior, cfg.code_dir)
    simulator = import_object(cfg.simulator, "workload.simulator", cfg.code_dir)
    if not callable(simulator):
        raise SimulatorError(f"workload.simulator: {cfg.simulator} is not callable")
    dim_theta, dim_x = _probe(prior, simulator, cfg.vectorized)
    return SimulationSource(
        name=f"{CUSTOM}:{cfg.simulator}",
        dim_theta=dim_theta,
        dim_x=dim_x,
        vectorized=cfg.vectorized,
        fingerprint={
            "prior": cfg.prior,
            "prior_source": _source_digest(
                import_object(cfg.prior, "workload.prior", cfg.code_dir)
            ),
            "simulator": cfg.simulator,
            "simulator_source": _source_digest(simulator),
        },
        prior=prior,
        simulator=simulator,
    )


def _probe(
    prior: torch.distributions.Distribution, simulator: Any, vectorized: bool
) -> tuple[int, int]:
    """(dim_theta, dim_x) from x for two prior draws, checked; for a per-sample simulator that
    raises on both, from the first of up to PROBE_RETRIES more draws it simulates (it may fail
    on a region of the prior only). Seeded, and without touching the caller's RNG state."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(PROBE_SEED)
        theta = prior.sample((2,))
        if theta.dim() != 2:
            raise SimulatorError(
                f"workload.prior: sample((2,)) gave shape {list(theta.shape)}; expected "
                "[2, dim_theta] (wrap a scalar prior with torch.distributions.Independent)"
            )
        try:
            x = check_simulator_output(simulator(theta.to(torch.float32)), 2, None)
            return theta.shape[1], x.shape[1]
        except SimulatorError:
            raise
        except Exception as exc:
            error = f"failed on 2 prior draws: {type(exc).__name__}: {first_line(exc)}"
        if not vectorized:
            for _ in range(PROBE_RETRIES):
                try:
                    out = simulator(prior.sample((1,)).to(torch.float32))
                except Exception:
                    continue
                return theta.shape[1], check_simulator_output(out, 1, None).shape[1]
            error += f" (and on {PROBE_RETRIES} more draws, one at a time)"
    raise SimulatorError(f"workload.simulator: {error}")
