"""Simulation-based inference workload: benchmark tasks and user simulators, the simulation
stage, neural posterior estimation with sbi's estimators, evaluation (C2ST, SBC) and export to
sbi's ``DirectPosterior``."""

from trainforge.workloads.sbi.export import load_posterior

__all__ = ["load_posterior"]
