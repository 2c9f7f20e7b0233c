"""What a method of simulation-based inference is to the workload: which tensor its estimator
models and which it is conditioned on, whether an embedding net on x fits it, whether its
posterior is amortized, and how sbi makes the estimator and the posterior. Each method is one
module beside this one that fills in a ``Method``; no torch here, so that the driver checks a
recipe's method without importing it (torch and sbi are imported when a method builds)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

T = TypeVar("T")

FLOW_SETTINGS = ("num_transforms", "num_bins", "num_components")
"""``estimator.build`` passes the flows' keys to every builder; a builder of an estimator that
is no flow (a classifier, a vector field) drops them."""


@dataclass(frozen=True)
class Method:
    name: str
    """sbi's name for it: npe, nle, nre, nre_c, fmpe, npse (its trainers: NPE, NLE, NRE_B,
    NRE_C, FMPE, NPSE)."""
    learns: str
    """What its estimator models, in words for messages and docs."""
    input: Literal["theta", "x"]
    """The tensor the estimator's density is over; the other one is its condition."""
    embeds_x: bool
    """Whether ``workload.estimator.embedding`` (a net on x) applies: x must be the condition."""
    amortized: bool
    """Whether its posterior at a new x costs a pass of the network (NPE), or a fresh
    inference such as MCMC chains (NLE): SBC needs it at many x."""
    builder: Callable[[], Callable[..., Callable[[Any, Any], Any]]]
    """sbi's builder factory (``posterior_nn``, ``likelihood_nn``), imported when called."""
    posterior: Callable[[Any, Any, dict[str, Any], str], Any]
    """``posterior(estimator, prior, sampling, device)``: sbi's posterior object of the trained
    estimator; ``sampling`` holds ``workload.posterior``'s settings."""
    default_model: str = "maf"
    """``workload.estimator.model`` when the recipe names none."""
    models: tuple[str, ...] = ()
    """The builder names its estimator takes (empty: sbi's density estimators,
    ``architecture.ESTIMATORS``); a name of another method's is refused."""
    arguments: tuple[str, ...] = ()
    """``workload.estimator.model_kwargs`` the method's own builder takes beside sbi's."""
    checks_arguments: bool = False
    """Its builder refuses ``model_kwargs`` it does not take by itself (fmpe, npse: sbi's
    vector-field factories, which ``net_builders`` does not list)."""
    validation_loss: Callable[[Any, Any, Any], Any] | None = None
    """``validation_loss(estimator, input, condition)``: per-row loss for val/loss where the
    training loss is a random draw (fmpe, npse: at fixed times); None: the training loss."""
    graph_blocker: str | None = None
    """Why its training step cannot be captured as a CUDA graph (``precision.cuda_graphs:
    true`` is refused at recipe load; ``auto`` tries, and falls back to eager steps with a
    line); None: it can (npe with zuko's flows, nle, nre on one H100)."""
    proposes: Literal["truncated_prior", "posterior"] | None = None
    """How a later sequential round (``workload.rounds``) draws its θ from what the round
    before learned at the observation: the prior truncated to the posterior's highest-density
    region (TSNPE: NPE's loss stays right on such θ, no correction), or the posterior itself
    (SNLE, SNRE: their losses take θ from any proposal); None: no sequential rounds."""
    calibration_skipped: str | None = None
    """Why SBC and TARP skip its amortized posterior anyway, for the evaluation's one line
    (npse: its sampler's cost); None: they run where the posterior is amortized."""

    def arrange(self, theta: T, x: T) -> tuple[T, T]:
        """(input, condition) of the estimator's ``loss``/``log_prob`` from a (θ, x) batch."""
        return (x, theta) if self.input == "x" else (theta, x)
