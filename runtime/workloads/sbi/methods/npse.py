"""Neural posterior score estimation (sbi's NPSE): the estimator is sbi's score network
s(θ_t, x, t) ≈ ∇ log p_t(θ_t | x) of a diffusion that noises the posterior q(θ | x) (sbi's
default variance-exploding SDE, ``model_kwargs.sde_type``: ve | vp | subvp), trained by
denoising score matching (its ``loss`` draws t and the noise inside); the posterior is sbi's
``VectorFieldPosterior`` with sbi's NPSE default sampler, the reverse SDE by Euler-Maruyama
over 500 steps, rejecting samples outside the prior's support. Amortized: a new x costs 500
network passes over its samples (two_moons here: 1,000 samples in ~0.7 s of one core).
What it shares with FMPE is in ``vector_field``."""

from __future__ import annotations

from trainforge.workloads.sbi.methods import vector_field
from trainforge.workloads.sbi.methods.base import Method

METHOD = Method(
    name="npse",
    learns="the posterior q(θ | x) as the score of a diffusion",
    input="theta",
    embeds_x=True,
    amortized=True,
    builder=vector_field.factory("posterior_score_nn"),
    posterior=vector_field.posterior("sde"),
    default_model=vector_field.DEFAULT_NET,
    models=vector_field.NETS,
    checks_arguments=True,
    validation_loss=vector_field.validation_loss,
    graph_blocker=vector_field.GRAPH_BLOCKER,
    # two_moons_npse_debug, one core: 50 × 100 SBC draws 18 s and TARP's 50 × 200 44 s, as
    # sbi's batched rejection sampler integrates up to 100,000 proposals a round
    calibration_skipped="integrates 500 SDE steps over up to 100,000 proposals a round "
    "(SBC and TARP over 50 runs: ~60 s of one core)",
)
