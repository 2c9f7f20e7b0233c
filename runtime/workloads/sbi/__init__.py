"""Simulation-based inference workload: benchmark tasks (priors, simulators, observations,
likelihoods), reference posterior samplers and the C2ST metric of the sbibm benchmark."""
