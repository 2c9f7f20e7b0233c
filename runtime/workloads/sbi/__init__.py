"""Simulation-based inference workload: benchmark tasks and user simulators, the simulation
stage, neural posterior estimation with sbi's estimators, evaluation (C2ST, SBC) and export to
sbi's ``DirectPosterior``. ``SPEC`` is the family's entry in the workload registry."""

from trainforge.workloads.sbi.export import load_posterior
from trainforge.workloads.sbi.workload import SPEC

__all__ = ["SPEC", "load_posterior"]
