"""Neural posterior estimators built by sbi's own builders, and what DDP needs around them.

- Recipes name estimators by sbi's builder names (``maf``, ``nsf``, ``zuko_nsf`` …); sbi is
  moving from such strings to config objects, so the mapping lives here, in one place.
- sbi's builders z-score θ and x inside the network from the batch they are given: we give them
  the whole training set, identically on every rank, so the statistics are global and equal.
- The weights alone cannot rebuild the network (the builder, its settings and the embedding net
  decide the architecture), so a ``BuildRecord`` — plain data — goes with every checkpoint and
  export; ``rebuild`` makes the same architecture from it, and the state dict fills it in.
- sbi's estimators train through ``loss(θ, condition=x)`` and have no ``forward``; DDP hooks
  gradients through ``forward``, hence ``NPELoss``.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from typing import Protocol, cast

import torch
from torch import Tensor, nn

from trainforge.errors import RecipeError, UserCodeError
from trainforge.log import first_line
from trainforge.workloads import user_code
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


def users_embedding_net(record: BuildRecord) -> nn.Module:
    """The user's own embedding net (``embedding: my_pkg.nets:MyNet``): called with
    ``embedding_kwargs``, and ``dim_x`` where it takes it."""
    path, key = record.embedding, "workload.estimator.embedding"
    entry = user_code.import_object(path, key, record.code_dir, EmbeddingError)
    arguments = dict(record.embedding_kwargs)
    with contextlib.suppress(TypeError, ValueError):  # no signature to read: kwargs only
        if "dim_x" in inspect.signature(entry).parameters:
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
    """sbi's estimator, its z-scoring computed from (θ, x) — pass the whole training set."""
    from sbi.neural_nets import posterior_nn

    build_fn = posterior_nn(
        model=record.model,
        z_score_theta=record.z_score_theta,
        z_score_x=record.z_score_x,
        hidden_features=record.hidden_features,
        num_transforms=record.num_transforms,
        num_bins=record.num_bins,
        num_components=record.num_components,
        embedding_net=embedding_net(record),
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sbi warns about moving the embedding net to the CPU
        return build_fn(theta.float().cpu(), x.float().cpu())


def rebuild(record: BuildRecord, state_dict: dict[str, Tensor]) -> nn.Module:
    """The estimator described by ``record`` with ``state_dict`` loaded (z-score buffers too)."""
    # Any batch will do: the z-score statistics computed from it are overwritten by the state
    # dict. Two distinct rows keep the standard deviation finite.
    theta = torch.stack([torch.zeros(record.dim_theta), torch.ones(record.dim_theta)])
    x = torch.stack([torch.zeros(record.dim_x), torch.ones(record.dim_x)])
    estimator = build(record, theta, x)
    estimator.load_state_dict(state_dict)
    return estimator


class DensityEstimator(Protocol):
    """What NPELoss needs of sbi's ConditionalDensityEstimator (sbi imported only when built)."""

    def loss(self, input: Tensor, condition: Tensor) -> Tensor: ...


class NPELoss(nn.Module):
    """DDP-wrappable estimator: ``forward(θ, x)`` is sbi's per-sample NPE loss, −log q(θ | x)."""

    def __init__(self, estimator: nn.Module) -> None:
        super().__init__()
        self.estimator = estimator

    def forward(self, theta: Tensor, x: Tensor) -> Tensor:
        estimator = cast(DensityEstimator, self.estimator)
        return estimator.loss(theta, condition=x)
