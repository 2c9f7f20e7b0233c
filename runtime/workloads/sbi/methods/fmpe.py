"""Flow-matching posterior estimation (sbi's FMPE): the estimator is sbi's flow-matching
vector field v(θ_t, x, t), trained to carry the posterior q(θ | x) to a standard normal along
straight paths (its ``loss`` draws t and the noise inside); the posterior is sbi's
``VectorFieldPosterior``, which samples by solving the flow's ODE from the normal back to θ
(sbi's FMPE default, ``sample_with: ode``) and rejects samples outside the prior's support.
Amortized: a new x costs an ODE solve, no fresh training or MCMC. What it shares with NPSE
is in ``vector_field``."""

from __future__ import annotations

from trainforge.workloads.sbi.methods import vector_field
from trainforge.workloads.sbi.methods.base import Method

METHOD = Method(
    name="fmpe",
    learns="the posterior q(θ | x) as a flow-matching vector field",
    input="theta",
    embeds_x=True,
    amortized=True,
    builder=vector_field.factory("posterior_flow_nn"),
    posterior=vector_field.posterior("ode"),
    default_model=vector_field.DEFAULT_NET,
    models=vector_field.NETS,
    checks_arguments=True,
    validation_loss=vector_field.validation_loss,
    graph_blocker=vector_field.GRAPH_BLOCKER,
)
