"""Density estimators built by sbi's own builders, and what DDP needs around them.

- Recipes name estimators by sbi's builder names (``maf``, ``nsf``, ``zuko_nsf`` …); sbi is
  moving from such strings to config objects, so the mapping lives here, in one place. The
  method (``methods/``) picks sbi's factory: ``posterior_nn`` for q(θ | x) (NPE),
  ``likelihood_nn`` for q(x | θ) (NLE); both are called with (θ, x), as sbi's trainers do.
- sbi's builders z-score θ and x inside the network from the batch they are given: we give them
  the whole training set, identically on every rank, so the statistics are global and equal.
- The weights alone cannot rebuild the network (the builder, its settings and the embedding net
  decide the architecture), so a ``BuildRecord`` — plain data — goes with every checkpoint and
  export; ``rebuild`` makes the same architecture from it, and the state dict fills it in.
- sbi's estimators train through ``loss(input, condition=…)`` and have no ``forward``; DDP
  hooks gradients through ``forward``, hence ``EstimatorLoss``.
"""

from __future__ import annotations

import dataclasses
import inspect
import warnings
from typing import Protocol, cast

import torch
from torch import Tensor, nn

from trainforge.errors import RecipeError, UserCodeError
from trainforge.log import first_line
from trainforge.workloads import user_code
from trainforge.workloads.sbi import methods
from trainforge.workloads.sbi.architecture import (  # noqa: F401 - re-exported: BuildRecord, …
    EMBEDDINGS,
    ESTIMATORS,
    Z_SCORES,
    BuildRecord,
    check,
    check_shape,
)

# nflows' NSF (sbi's ``nsf``) inverts its LU transforms with torch.triangular_solve
# when a posterior samples, and torch warns once per process that it is deprecated: a line on
# every NSF run's console, at its evaluation, that no user can act on
warnings.filterwarnings(
    "ignore", message="torch.triangular_solve is deprecated", category=UserWarning
)


class EmbeddingError(UserCodeError):
    """The user's embedding net cannot be imported, raises, or does not map x to features."""


class BuilderError(UserCodeError):
    """The user's estimator builder (or sbi's, given ``model_kwargs``) cannot be imported,
    raises, or makes no density estimator."""


def users_embedding_net(record: BuildRecord) -> nn.Module:
    """The user's own embedding net (``embedding: my_pkg.nets:MyNet``): called with
    ``embedding_kwargs``, and ``dim_x`` where it takes it."""
    path, key = record.embedding, "workload.estimator.embedding"
    entry = user_code.import_object(path, key, record.code_dir, EmbeddingError)
    arguments = dict(record.embedding_kwargs)
    if user_code.takes(entry, "dim_x"):
        arguments["dim_x"] = record.dim_x
    try:
        net = entry(**arguments)
    except Exception as exc:  # the user's constructor: theirs to see, in one line
        given = ", ".join(f"{k}={v!r}" for k, v in arguments.items())
        raise EmbeddingError(
            f"{key}: {path}({given}) raised {type(exc).__name__}: {first_line(exc)}"
        ) from exc
    if not isinstance(net, nn.Module):
        raise EmbeddingError(f"{key}: {path} returned {type(net).__name__}, not an nn.Module")
    return net


def probe_embedding(record: BuildRecord) -> None:
    """The driver's check of the user's embedding net: two rows of x in, a row of features
    each out."""
    net, path = users_embedding_net(record), record.embedding
    x = torch.zeros(2, record.dim_x)
    try:
        with torch.no_grad():
            features = net(x)
    except Exception as exc:
        raise EmbeddingError(
            f"workload.estimator.embedding: {path} on x of shape (2, {record.dim_x}) raised "
            f"{type(exc).__name__}: {first_line(exc)}"
        ) from exc
    if not torch.is_tensor(features) or features.dim() != 2 or len(features) != 2:
        shape = tuple(features.shape) if torch.is_tensor(features) else type(features).__name__
        raise EmbeddingError(
            f"workload.estimator.embedding: {path} returned {shape} for x of shape "
            f"(2, {record.dim_x}): expected (2, features)"
        )


def embedding_net(record: BuildRecord) -> nn.Module:
    shape = list(record.embedding_input_shape)
    check_shape(shape, record.dim_x)
    if record.embedding == "none":
        return nn.Identity()
    if user_code.is_import_path(record.embedding):
        return users_embedding_net(record)
    # Only now: the driver checks recipes with this before any worker starts, and importing
    # sbi costs it ~1.4 s on this project's CPU; without an embedding net it needs no sbi.
    from sbi.neural_nets.embedding_nets import (
        CNNEmbedding,
        FCEmbedding,
        PermutationInvariantEmbedding,
    )

    if record.embedding == "fully_connected":
        return FCEmbedding(
            record.dim_x, output_dim=record.embedding_features, num_hiddens=record.embedding_hidden
        )
    if record.embedding == "cnn":
        channels = shape[0] if len(shape) == 3 else 1
        try:
            return CNNEmbedding(
                tuple(shape[-2:]) if len(shape) >= 2 else tuple(shape),
                in_channels=channels,
                num_linear_units=record.embedding_hidden,
                output_dim=record.embedding_features,
            )
        except (AssertionError, ValueError) as exc:  # sbi checks the shape with assert
            message = " ".join(str(exc).split())
            raise RecipeError(f"workload.estimator.embedding_input_shape: {message}") from None
    set_size, features = shape
    element_net = FCEmbedding(features, output_dim=record.embedding_hidden, num_hiddens=64)
    return nn.Sequential(
        nn.Unflatten(1, (set_size, features)),  # x is stored flat: one row per simulation
        PermutationInvariantEmbedding(
            element_net,
            trial_net_output_dim=record.embedding_hidden,
            output_dim=record.embedding_features,
        ),
    )


def build(record: BuildRecord, theta: Tensor, x: Tensor) -> nn.Module:
    """The estimator, its z-scoring computed from (θ, x) — pass the whole training set: sbi's
    builder by name, or the user's by import path."""
    if user_code.is_import_path(record.model):
        return users_estimator(record, theta, x)
    factory = methods.get(record.method).builder()

    build_fn = factory(
        model=record.model,
        z_score_theta=record.z_score_theta,
        z_score_x=record.z_score_x,
        hidden_features=record.hidden_features,
        num_transforms=record.num_transforms,
        num_bins=record.num_bins,
        num_components=record.num_components,
        embedding_net=embedding_net(record),
        **record.model_kwargs,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sbi warns about moving the embedding net to the CPU
        return build_fn(theta.float().cpu(), x.float().cpu())


ESTIMATOR_METHODS = ("loss", "log_prob", "sample")


def users_estimator(record: BuildRecord, theta: Tensor, x: Tensor) -> nn.Module:
    """The user's own builder (``model: my_pkg.flows:build``), called as sbi calls a density
    estimator builder: ``build(θ, x)``, with ``model_kwargs`` and, where it takes one, the
    recipe's ``embedding_net``. It builds what the method learns: q(θ | x) for NPE, q(x | θ)
    for NLE (as sbi's NLE takes a builder)."""
    path, key = record.model, "workload.estimator.model"
    entry = user_code.import_object(path, key, record.code_dir, BuilderError)
    arguments = dict(record.model_kwargs)
    if user_code.takes(entry, "embedding_net"):
        arguments["embedding_net"] = embedding_net(record)
    elif record.embedding != "none":
        raise BuilderError(f"{key}: {path} takes no embedding_net, and workload.estimator."
                           f"embedding is {record.embedding}")  # fmt: skip
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # as for sbi's builders
            made = entry(theta.float().cpu(), x.float().cpu(), **arguments)
    except Exception as exc:  # the user's builder: theirs to see, in one line
        given = "".join(f", {k}={v!r}" for k, v in arguments.items() if k != "embedding_net")
        raise BuilderError(f"{key}: {path}(θ, x{given}) raised {type(exc).__name__}: "
                           f"{first_line(exc)}") from exc  # fmt: skip
    missing = [m for m in ESTIMATOR_METHODS if not callable(getattr(made, m, None))]
    if not isinstance(made, nn.Module) or missing:
        lacks = f" (no {', '.join(missing)})" if missing and isinstance(made, nn.Module) else ""
        raise BuilderError(
            f"{key}: {path} returned {type(made).__name__}{lacks}: expected a density "
            "estimator, an nn.Module with loss, log_prob and sample (sbi's "
            "ConditionalDensityEstimator)"
        )
    return made


def probe_estimator(record: BuildRecord) -> None:
    """The driver's check of a builder by import path, or of sbi's given ``model_kwargs``:
    built on two rows of θ and x, its loss is one value per row."""
    theta, x = _two_rows(record.dim_theta), _two_rows(record.dim_x)
    given, condition = methods.get(record.method).arrange("θ", "x")  # the loss's arguments
    key = "workload.estimator.model" if user_code.is_import_path(record.model) else (
        "workload.estimator.model_kwargs")  # fmt: skip
    if not user_code.is_import_path(record.model):
        _check_sbi_arguments(record)
        record = _small(record)
    try:
        made = build(record, theta, x)
    except UserCodeError:
        raise
    except Exception as exc:  # sbi's builder refusing an argument it was given
        raise BuilderError(f"{key}: sbi's {record.model} builder given {record.model_kwargs} "
                           f"raised {type(exc).__name__}: {first_line(exc)}") from exc  # fmt: skip
    call = f"loss({given}, condition={condition})"
    try:
        loss = EstimatorLoss(made, record.method)(theta, x)
    except Exception as exc:
        raise BuilderError(f"{key}: {record.model}'s {call} on two rows raised "
                           f"{type(exc).__name__}: {first_line(exc)}") from exc  # fmt: skip
    if not torch.is_tensor(loss) or tuple(loss.shape) != (2,):
        shape = tuple(loss.shape) if torch.is_tensor(loss) else type(loss).__name__
        raise BuilderError(f"{key}: {record.model}'s {call} returned {shape} for "
                           "two rows: expected (2,), one loss per row")  # fmt: skip


PROBE_SIZE = 4
"""The widest layer, the most transforms, bins and components of the probe's build of sbi's
network: what it checks (the arguments sbi takes, one loss per row) does not depend on them,
and a recipe's 6,459,100 hidden units took 24 GB in the probe (the workers build it as
given)."""


def _small(record: BuildRecord) -> BuildRecord:
    sizes = ("hidden_features", "num_transforms", "num_bins", "num_components",
             "embedding_features", "embedding_hidden")  # fmt: skip
    return dataclasses.replace(record, **{k: min(getattr(record, k), PROBE_SIZE) for k in sizes})


# posterior_nn's own arguments, which the recipe's estimator keys set
SET_BY_RECIPE = {"batch_x", "batch_y", "z_score_x", "z_score_y", "hidden_features",
                 "num_transforms", "num_bins", "num_components", "embedding_net"}  # fmt: skip


def _check_sbi_arguments(record: BuildRecord) -> None:
    """``model_kwargs`` for sbi's builder by name: the arguments its builder names. sbi's
    nflows builders (maf, nsf, mdn, made, maf_rqs) drop any other silently, so a misspelt one
    would train a network other than the recipe's; its zuko builders pass the rest to zuko,
    which refuses what it does not know (the probe's build finds it)."""
    if methods.get(record.method).checks_arguments:
        return  # its builder names what it takes (methods/vector_field.py)
    from sbi.neural_nets import net_builders

    # a classifier's builder (method nre's) is build_<name>_classifier
    builder = getattr(net_builders, f"build_{record.model}", None) or getattr(
        net_builders, f"build_{record.model}_classifier")  # fmt: skip
    named = [name for name, p in inspect.signature(builder).parameters.items()
             if p.kind is not p.VAR_KEYWORD and name not in SET_BY_RECIPE]  # fmt: skip
    named += methods.get(record.method).arguments
    for name in record.model_kwargs:
        if name in SET_BY_RECIPE:
            raise BuilderError(f"workload.estimator.model_kwargs.{name}: set by the recipe's "
                               "own workload.estimator keys, not here")  # fmt: skip
        if name not in named and not record.model.startswith("zuko_"):
            takes = ", ".join(named)
            raise BuilderError(f"workload.estimator.model_kwargs.{name}: sbi's {record.model} "
                               f"builder takes no {name!r}; it takes {takes}")  # fmt: skip


def _two_rows(dim: int) -> Tensor:
    """Two distinct rows: a z-scoring builder's standard deviation stays finite."""
    return torch.stack([torch.zeros(dim), torch.ones(dim)])


def rebuild(record: BuildRecord, state_dict: dict[str, Tensor]) -> nn.Module:
    """The estimator described by ``record`` with ``state_dict`` loaded (z-score buffers too)."""
    # Any batch will do: the z-score statistics computed from it are overwritten by the state
    # dict.
    estimator = build(record, _two_rows(record.dim_theta), _two_rows(record.dim_x))
    estimator.load_state_dict(state_dict)
    return estimator


class DensityEstimator(Protocol):
    """What EstimatorLoss needs of sbi's ConditionalDensityEstimator (sbi imported only when
    built)."""

    def loss(self, input: Tensor, condition: Tensor) -> Tensor: ...


class EstimatorLoss(nn.Module):
    """DDP-wrappable estimator: ``forward(θ, x)`` is sbi's per-sample loss of the method,
    −log q(θ | x) for NPE, −log q(x | θ) for NLE (the method orders input and condition)."""

    def __init__(self, estimator: nn.Module, method: str = "npe") -> None:
        super().__init__()
        self.estimator = estimator
        self.method = methods.get(method)  # looked up once, not at every step

    def forward(self, theta: Tensor, x: Tensor) -> Tensor:
        estimator = cast(DensityEstimator, self.estimator)
        method = self.method
        given, condition = method.arrange(theta, x)
        if not self.training and method.validation_loss is not None:
            return method.validation_loss(self.estimator, given, condition)
        return estimator.loss(given, condition=condition)
