"""Neural ratio estimation (sbi's ``NRE``, which is NRE_B): the estimator is sbi's classifier
(``classifier_nn``: linear | mlp | resnet) whose output is the log ratio
log r(θ, x) = log p(x | θ) − log p(x), up to a constant in θ. It is trained on sbi's
contrastive 1-out-of-``num_atoms`` loss: each x of a batch is paired with its own θ and
``num_atoms`` − 1 θ of other rows of the same batch, and the classifier must pick its own.
The posterior is sbi's ``MCMCPosterior`` over log r(θ, x_o) + log p(θ) (its
``ratio_estimator_based_potential``), sampled as NLE's is (``workload.posterior``); every
observation is a fresh MCMC run: not amortized.

sbi computes this loss in its trainer's private ``_loss``; the classifier's forward (the
unnormalized log ratio) is the narrowest public piece, so ``ContrastiveRatio.loss`` builds the
atoms and the cross-entropy itself, as sbi defines them. ``num_atoms`` (sbi's default 10) is
the one setting of the loss: ``workload.estimator.model_kwargs.num_atoms``.

``nre_c`` is sbi's NRE_C (contrastive NRE, Miller et al. 2022): the same classifier and
posterior, its loss a K + 1-way classification between K θ of which one is x's own and K θ of
which none is, weighted by ``gamma`` (``model_kwargs.num_classes``, sbi's default 5, and
``model_kwargs.gamma``, 1.0)."""

from __future__ import annotations

from typing import Any

from trainforge.workloads.sbi.methods import mcmc
from trainforge.workloads.sbi.methods.base import FLOW_SETTINGS, Method

CLASSIFIERS = ("linear", "mlp", "resnet")
NUM_ATOMS = 10
"""sbi's default ``num_atoms`` for NRE_B."""
NUM_CLASSES, GAMMA = 5, 1.0
"""sbi's defaults for NRE_C."""
ATOM_ROWS = 4096
"""Rows whose θ a row's atoms are drawn from at most: the draw takes two (rows × rows) float
tensors, 134 MB at 4,096 rows; a validation batch of 16,384 would take 2 GB."""
VALIDATION_SEED = 1234
"""Validation draws its atoms from a generator of its own, reset every batch: each epoch's
val/loss sees the same atoms, so early stopping compares networks, not draws, and the
training stream (which checkpoints hold) is left as it is."""


def _builder() -> Any:
    return _classifier_factory


def _builder_c() -> Any:
    return _classifier_factory_c


def _classifier_factory(
    model: str, z_score_theta: str, z_score_x: str, hidden_features: int,
    embedding_net: Any = None, num_atoms: int = NUM_ATOMS, variant: str = "b",
    gamma: float = GAMMA, **settings: Any,
) -> Any:  # fmt: skip
    """sbi's ``classifier_nn`` as ``estimator.build`` calls a density builder: the recipe's
    embedding net is the one on x, the flow settings (``num_transforms``, ``num_bins``,
    ``num_components``) mean nothing to a classifier and are dropped; ``num_atoms``,
    ``variant`` (NRE_B's loss or NRE_C's) and ``gamma`` are the loss's."""
    from sbi.neural_nets import classifier_nn
    from torch import nn

    for flow_setting in FLOW_SETTINGS:
        settings.pop(flow_setting, None)
    build_fn = classifier_nn(
        model=model, z_score_theta=z_score_theta, z_score_x=z_score_x,
        hidden_features=hidden_features, embedding_net_x=embedding_net or nn.Identity(),
        **settings,
    )  # fmt: skip

    def build(theta: Any, x: Any) -> Any:
        made = __getattr__("ContrastiveRatio")
        return made(build_fn(theta, x), int(num_atoms), variant, float(gamma))

    return build


def _classifier_factory_c(
    num_classes: int = NUM_CLASSES, gamma: float = GAMMA, **settings: Any
) -> Any:
    """NRE_C's: sbi keeps its K as ``num_atoms`` = K + 1 in the loss's arguments too."""
    return _classifier_factory(num_atoms=int(num_classes) + 1, variant="c", gamma=gamma,
                               **settings)  # fmt: skip


def contrastive_atoms(
    batch_size: int, num_atoms: int, generator: Any = None, device: Any = None
) -> Any:
    """(batch_size, num_atoms − 1) row indices: for each row, that many other rows, drawn
    uniformly without replacement, as sbi's ``_classifier_logits`` draws them (the same
    ``torch.multinomial`` over the batch less the row itself, so the same indices from the same
    generator state), but on the batch's device: a CUDA graph captures the draw, and each replay
    draws afresh (seen on an H100, torch 2.11)."""
    import torch

    if num_atoms == 1:  # NRE_C's joint classes at K = 1: the row's own θ alone
        return torch.empty(batch_size, 0, dtype=torch.long, device=device)
    probs = torch.ones(batch_size, batch_size, device=device)
    probs = probs * (1 - torch.eye(batch_size, device=device)) / (batch_size - 1)
    return torch.multinomial(probs, num_atoms - 1, replacement=False, generator=generator)


def _atom_logits(ratio: Any, theta: Any, x: Any, atoms: int, generator: Any) -> Any:
    """(rows, atoms) logits: each row's x at its own θ (column 0) and at ``atoms`` − 1 θ of
    other rows (sbi's ``_classifier_logits``)."""
    import torch
    from sbi.utils.torchutils import repeat_rows

    rows = theta.shape[0]
    others = theta[contrastive_atoms(rows, atoms, generator, theta.device)]
    atomic_theta = torch.cat((theta[:, None, :], others), dim=1).reshape(rows * atoms, -1)
    return ratio(atomic_theta, repeat_rows(x, atoms)).reshape(rows, atoms)


def _nre_b_loss(ratio: Any, theta: Any, x: Any, num_atoms: int, gamma: float,
                generator: Any) -> Any:  # fmt: skip
    """Per-row NRE_B loss of one block of rows: −log softmax over its atoms' logits at its
    own θ (sbi's ``NRE_B._loss``, whose batch mean is this one's)."""
    import torch

    atoms = min(num_atoms, theta.shape[0])  # sbi clamps num_atoms to the batch too
    if atoms < 2:  # a lone row has nothing to be told apart from
        return theta.new_zeros(theta.shape[0])
    logits = _atom_logits(ratio, theta, x, atoms, generator)
    return -(logits[:, 0] - torch.logsumexp(logits, dim=-1))  # atom 0: the joint pair


def _nre_c_loss(ratio: Any, theta: Any, x: Any, num_atoms: int, gamma: float,
                generator: Any) -> Any:  # fmt: skip
    """Per-row NRE_C loss of one block of rows (sbi's ``NRE_C._loss``, whose batch mean is
    this one's): K = num_atoms − 1 classes; K θ none of which is x's own (drawn first, as
    sbi does) against K of which the first is, the classifier's logits offset by log γ
    against the class of 'none', log K; the two terms weighted 1 / (1 + γ) and γ / (1 + γ)."""
    import math

    import torch

    k = min(num_atoms - 1, theta.shape[0] - 1)
    if k < 1:
        return theta.new_zeros(theta.shape[0])
    marginal = _atom_logits(ratio, theta, x, k + 1, generator)[:, 1:]
    joint = _atom_logits(ratio, theta, x, k, generator)
    log_gamma, log_k = math.log(gamma), math.log(k)
    none = torch.full_like(joint[:, :1], log_k)
    log_p_marginal = log_k - torch.logsumexp(torch.cat([log_gamma + marginal, none], -1), -1)
    log_p_joint = log_gamma + joint[:, 0] - torch.logsumexp(
        torch.cat([log_gamma + joint, none], -1), -1)  # fmt: skip
    return -(log_p_marginal + gamma * log_p_joint) / (1 + gamma)


def _define() -> type:
    """``ContrastiveRatio``, defined on first use: torch is imported only when a method builds
    (``base``'s rule), and the module's ``__getattr__`` defines it for pickle too."""
    import torch
    from torch import Tensor, nn

    class ContrastiveRatio(nn.Module):
        """sbi's ratio estimator (``ratio``) with the contrastive loss the loop trains:
        ``loss(θ, condition=x)``, one value per row, as sbi's density estimators have it
        (``estimator.EstimatorLoss`` calls it inside DDP's forward). Each rank's batch forms
        its own atoms; a batch above ``ATOM_ROWS`` rows is cut into equal blocks that each
        do. Training draws from the device's generator (seeded by the loop, kept in its
        checkpoints); validation from ``VALIDATION_SEED``."""

        def __init__(self, ratio: nn.Module, num_atoms: int = NUM_ATOMS, variant: str = "b",
                     gamma: float = GAMMA) -> None:  # fmt: skip
            super().__init__()
            self.ratio = ratio
            self.num_atoms, self.gamma = num_atoms, gamma
            self.variant_loss = _nre_c_loss if variant == "c" else _nre_b_loss

        def forward(self, theta: Tensor, x: Tensor) -> Tensor:
            return self.ratio(theta, x)  # the unnormalized log ratio

        def loss(self, input: Tensor, condition: Tensor) -> Tensor:
            generator = None
            if not self.training:
                generator = torch.Generator(input.device).manual_seed(VALIDATION_SEED)
            blocks = -(-input.shape[0] // ATOM_ROWS)
            losses = [
                self.variant_loss(self.ratio, theta, x, self.num_atoms, self.gamma, generator)
                for theta, x in zip(
                    input.tensor_split(blocks), condition.tensor_split(blocks), strict=True
                )
            ]
            return losses[0] if blocks == 1 else torch.cat(losses)

    ContrastiveRatio.__module__, ContrastiveRatio.__qualname__ = __name__, "ContrastiveRatio"
    return ContrastiveRatio


def __getattr__(name: str) -> Any:
    if name != "ContrastiveRatio":
        raise AttributeError(name)
    if name not in globals():
        globals()[name] = _define()
    return globals()[name]


def ratio_of(estimator: Any) -> Any:
    """sbi's ``RatioEstimator`` inside what ``build`` made (or the estimator itself: a user's
    builder may return sbi's ratio estimator directly)."""
    return getattr(estimator, "ratio", estimator)


def _posterior(estimator: Any, prior: Any, sampling: dict[str, Any], device: str) -> Any:
    from sbi.inference import ratio_estimator_based_potential

    potential, transform = ratio_estimator_based_potential(ratio_of(estimator), prior, x_o=None)
    return mcmc.posterior(potential, transform, prior, sampling, device)


METHOD = Method(
    name="nre",
    learns="the likelihood-to-evidence ratio r(θ, x) = p(x | θ) / p(x)",
    input="theta",
    embeds_x=True,
    amortized=False,
    builder=_builder,
    posterior=_posterior,
    default_model="resnet",
    models=CLASSIFIERS,
    arguments=("num_atoms",),
    proposes="posterior",
)
METHOD_C = Method(
    name="nre_c",
    learns="the likelihood-to-evidence ratio r(θ, x) = p(x | θ) / p(x) (NRE_C's loss)",
    input="theta",
    embeds_x=True,
    amortized=False,
    builder=_builder_c,
    posterior=_posterior,
    default_model="resnet",
    models=CLASSIFIERS,
    arguments=("num_classes", "gamma"),
    proposes="posterior",
)
