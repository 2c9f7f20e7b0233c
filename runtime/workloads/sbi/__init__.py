"""Simulation-based inference workload: benchmark tasks and user simulators, the simulation
stage, neural posterior and likelihood estimation with sbi's estimators (``methods/``),
evaluation (C2ST, SBC) and export to sbi's posterior objects. ``SPEC`` is the family's entry
in the workload registry: its checks and simulation stage come from ``checks.py`` (no torch
for a built-in task), the workload itself is built in the workers (``workload.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainforge.config.schema import PrecisionSection
from trainforge.workloads.sbi import rounds
from trainforge.workloads.sbi.checks import (
    check,
    check_data,
    needs_cluster,
    prepare_data,
    start_data,
    train_samples,
)
from trainforge.workloads.sbi.config import SBIWorkloadConfig
from trainforge.workloads.spec import Ensembles, Rounds, WorkloadSpec

if TYPE_CHECKING:
    from trainforge.workloads.sbi.workload import SBIWorkload


def build(cfg: SBIWorkloadConfig, seed: int, precision: PrecisionSection) -> SBIWorkload:
    from trainforge.workloads.sbi import workload  # torch, sbi's estimators

    return workload.build(cfg, seed, precision)


def combine(members: list[Path], out: Path) -> dict[str, Any]:
    from trainforge.workloads.sbi import ensemble  # torch

    return ensemble.combine(members, out)


def evaluate_mixture(
    posterior: Path, cfg: SBIWorkloadConfig, seed: int, folder: Path
) -> tuple[dict[str, float], list[Path]]:
    from trainforge.workloads.sbi import evaluate  # torch, sbi

    return evaluate.evaluate_ensemble(posterior, cfg, seed, folder)


def round_data(sections: list[SBIWorkloadConfig], folder: Path) -> list[str]:
    """A round's run trains on the simulations of every round so far, combined in ``folder``
    (the first round on its own)."""
    paths = [rounds.data_path(s) for s in sections]
    combined = paths[0] if len(paths) == 1 else rounds.training_data(paths, folder)
    return [f"workload.simulation.path={combined}"]


def posterior(cfg: SBIWorkloadConfig, run_dir: Path) -> Any:
    """A finished run's posterior, as sbi's posterior object (``trainforge.load``)."""
    from trainforge.workloads.sbi.ensemble import POSTERIOR_FILE
    from trainforge.workloads.sbi.export import load_posterior  # torch, sbi

    return load_posterior(run_dir / POSTERIOR_FILE)


SPEC = WorkloadSpec(
    kind="sbi",
    schema=SBIWorkloadConfig,
    build=build,
    check=check,
    check_data=check_data,
    train_samples=train_samples,
    start_data=start_data,
    prepare_data=prepare_data,
    needs_cluster=needs_cluster,
    # sbi's estimators (sbi.utils brings scipy.stats, sklearn, matplotlib), and what their
    # first forward pass imports: torch.broadcast_shapes imports symbolic_shapes (sympy)
    worker_imports=("sbi.neural_nets", "torch.fx.experimental.symbolic_shapes"),
    model_imports=("trainforge.workloads.sbi.pyfunc", "sbi"),  # the posterior's pyfunc
    trained=posterior,
    ensembles=Ensembles(
        members=lambda cfg: int(cfg.ensemble),
        output="posterior.pt",
        combine=combine,
        evaluate=evaluate_mixture,
    ),
    rounds=Rounds(
        count=lambda cfg: int(cfg.rounds),
        output=rounds.POSTERIOR_FILE,
        for_stage=rounds.for_stage,
        propose=rounds.propose,
        training_data=round_data,
        # one round each; calibration (SBC, TARP) is for amortized posteriors, and a later
        # round's is focused on one observation; the observed x is the rounds' (the driver's)
        overrides=(
            "workload.rounds=1",
            "workload.evaluation.sbc_runs=0",
            "workload.evaluation.observed=null",
        ),
    ),
    # a rehearsal's posterior is a few steps old: sampled and plotted, not scored
    rehearsal={"evaluation": {"c2st": False, "sbc_runs": 0, "num_samples": 100}},
)


def __getattr__(name: str) -> Any:
    """``load_posterior`` (``from trainforge.workloads.sbi import load_posterior``), imported
    when asked for: it needs torch and sbi."""
    if name == "load_posterior":
        from trainforge.workloads.sbi.export import load_posterior

        return load_posterior
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["SPEC", "load_posterior"]
