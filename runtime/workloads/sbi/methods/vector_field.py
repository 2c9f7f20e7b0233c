"""What the two vector-field methods (``fmpe``, ``npse``) share: sbi's vector-field estimator
of q(θ | x) — a network of (θ_t, x, t) for a time t in [0, 1], trained through its own
``loss(θ, condition=x)``, which draws t (and the noise) inside — and sbi's
``VectorFieldPosterior``, which samples by integrating it (an ODE, or sbi's SDE sampler)
and rejects samples outside the prior's support.

- The network is sbi's: ``mlp`` | ``ada_mlp`` | ``transformer`` | ``transformer_cross_attn``
  (``workload.estimator.model``; ``mlp`` when the recipe names none), ``hidden_features``
  wide, ``model_kwargs.num_layers`` deep (sbi's default 5). The flows' keys
  (``num_transforms``, ``num_bins``, ``num_components``) shape no vector field.
- sbi's vector-field factories forward an argument they do not know with only a warning (a
  misspelt one trains another network), so the factory here refuses it by name.
- The loss is a random draw of t per row: validation takes it at sbi's trainers' fixed times
  instead (``VALIDATION_TIMES`` of the estimator's ``solve_schedule``, ``TIME_NUGGET`` inside
  its ends), which cuts the spread of an epoch's val/loss from a 500-row two_moons split
  about fivefold (NPSE: std 1.09 to 0.19 on a mean of 28; FMPE: 0.021 to 0.006), so early
  stopping compares networks rather than draws of t.
- Torch and sbi are imported when a method builds (``base``'s rule).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from trainforge.workloads.sbi.methods.base import FLOW_SETTINGS

NETS = ("mlp", "ada_mlp", "transformer", "transformer_cross_attn")
"""sbi's vector-field networks, by its names (``posterior_flow_nn(model=…)``)."""
DEFAULT_NET = "mlp"
SET_HERE = ("model", "z_score_theta", "z_score_x", "hidden_features", "embedding_net")
"""The factory's arguments that the recipe's own ``workload.estimator`` keys set."""
GRAPH_BLOCKER = (
    "sbi's vector-field loss reads its standardization flag, a tensor on the GPU, on the host "
    "at every step (its capture fails on one H100: cudaErrorStreamCaptureInvalidated)"
)
VALIDATION_TIMES = 10
TIME_NUGGET = 0.05
"""sbi's trainers' validation times: 10 of ``solve_schedule`` within [t_min + 0.05,
t_max − 0.05], where the loss's variance is largest at the ends."""


def factory(name: str) -> Callable[[], Callable[..., Callable[[Any, Any], Any]]]:
    """``Method.builder`` for sbi's factory ``name`` (``posterior_flow_nn``,
    ``posterior_score_nn``), called as ``estimator.build`` calls a density builder."""

    def builder() -> Callable[..., Callable[[Any, Any], Any]]:
        from sbi import neural_nets

        made_by = getattr(neural_nets, name)

        def make(model: str, z_score_theta: str, z_score_x: str, hidden_features: int,
                 embedding_net: Any, **settings: Any) -> Callable[[Any, Any], Any]:  # fmt: skip
            for flow_setting in FLOW_SETTINGS:
                settings.pop(flow_setting, None)
            unknown = sorted(set(settings) - set(arguments(made_by)))
            if unknown:
                raise TypeError(f"sbi's {name} takes no {unknown[0]!r}; it takes "
                                + ", ".join(arguments(made_by)))  # fmt: skip
            return made_by(
                model=model, z_score_theta=z_score_theta, z_score_x=z_score_x,
                hidden_features=hidden_features, embedding_net=embedding_net, **settings,
            )  # fmt: skip

        return make

    return builder


def arguments(made_by: Callable[..., Any]) -> list[str]:
    """What ``workload.estimator.model_kwargs`` may give sbi's factory ``made_by``: its own
    named arguments and the fields of the config it builds, less what the recipe's keys set
    (the config's internal names for them too)."""
    import dataclasses

    from sbi.neural_nets import factory as sbi_factory

    config = {"posterior_flow_nn": "FlowEstimatorConfig",
              "posterior_score_nn": "ScoreEstimatorConfig"}[made_by.__name__]  # fmt: skip
    fields = [f.name for f in dataclasses.fields(getattr(sbi_factory, config))]
    named = [n for n, p in inspect.signature(made_by).parameters.items()
             if p.kind is not p.VAR_KEYWORD]  # fmt: skip
    internal = {"net", "z_score_y", "extra_kwargs", "estimator_type", "time_embedding_dim"}
    return sorted({*named, *fields} - set(SET_HERE) - internal - {"z_score_x"})


def posterior(sample_with: str) -> Callable[[Any, Any, dict[str, Any], str], Any]:
    """``Method.posterior``: sbi's ``VectorFieldPosterior`` sampling ``sample_with`` (ode |
    sde), as sbi's trainer of the method builds it by default; ``workload.posterior``'s MCMC
    settings do not apply to it."""

    def make(estimator: Any, prior: Any, sampling: dict[str, Any], device: str) -> Any:
        from sbi.inference import VectorFieldPosterior

        return VectorFieldPosterior(estimator, prior, device=device, sample_with=sample_with)

    return make


def validation_loss(estimator: Any, input: Any, condition: Any) -> Any:
    """Per row, the loss's mean over the fixed validation times (sbi's trainers' rule)."""
    times = estimator.solve_schedule(
        VALIDATION_TIMES, t_min=estimator.t_min + TIME_NUGGET,
        t_max=estimator.t_max - TIME_NUGGET,
    ).to(input.device)  # fmt: skip
    rows = len(input)
    repeated = (1,) * (input.dim() - 1)
    losses = estimator.loss(
        input.repeat(VALIDATION_TIMES, *repeated),
        condition=condition.repeat(VALIDATION_TIMES, *((1,) * (condition.dim() - 1))),
        times=times.repeat_interleave(rows),
    )
    return losses.reshape(VALIDATION_TIMES, rows).mean(dim=0)
