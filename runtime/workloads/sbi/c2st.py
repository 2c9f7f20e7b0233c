"""Classifier two-sample test (C2ST) with the sbibm benchmark's definition, computed by sbi.

A classifier learns to tell samples of P (the reference posterior) from samples of Q (the
approximation); its cross-validated accuracy is the score: 0.5 when it cannot tell them apart,
1.0 when it always can. sbibm's definition (Lueckmann et al. 2021, ``sbibm.metrics.c2st``):

- both sample sets are z-scored with the mean and standard deviation (n - 1 denominator) of the
  *reference* samples, the first argument;
- an sklearn ``MLPClassifier``: ReLU, two hidden layers of 10·dim units, adam, up to 10,000
  iterations, seeded; sklearn's defaults otherwise (no early stopping);
- 5-fold shuffled ``KFold`` cross-validation of accuracy, averaged;
- in float32: sbibm's samples are float32 tensors, z-scored in torch and handed to sklearn as
  they are, so the classifier trains in float32.

``sbi.utils.metrics.c2st`` does exactly this when given ``classifier="mlp"`` and these
``classifier_kwargs`` (its defaults differ: a random forest, or an MLP with early stopping and
1,000 iterations, whose numbers are not comparable with sbibm's tables). This module is that
call plus input checks; it replaced this project's own copy of the definition, which computed
in float64: on the same samples and seed, sbi's c2st equals that copy's value for float64 input
and sbibm's for float32 input, and the two dtypes can differ by about a standard error of the
score (0.520 against 0.507 on 1,000 + 1,000 five-dimensional samples). Inputs are therefore cast
to float32 first, as sbibm's were; ``tests/unit/test_sbi_c2st.py`` checks both equalities.

The folds are independent (each classifier is seeded alike), so they can train at once in
several processes (``processes``: joblib's loky pool, which sklearn's cross-validation uses when
asked) with the same score: a 10-d C2ST of 10,000 + 10,000 samples takes 1-2 min on one core.
The pool's processes stay for later calls of the same process (a warm worker's next run);
``fold_processes`` keeps a small C2ST on a small machine in one process.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

ArrayLike = torch.Tensor | np.ndarray


def sbibm_classifier(dim: int) -> dict[str, Any]:
    """sbibm's MLPClassifier settings for ``dim``-dimensional samples."""
    return {
        "activation": "relu",
        "hidden_layer_sizes": (10 * dim, 10 * dim),
        "max_iter": 10_000,
        "solver": "adam",
    }


def _as_tensor(samples: ArrayLike, label: str) -> torch.Tensor:
    tensor = torch.as_tensor(samples).detach().cpu()
    if tensor.dim() != 2:
        raise ValueError(f"{label} must be [n, dim], got shape {tuple(tensor.shape)}")
    tensor = tensor.to(torch.float32)
    bad = int((~torch.isfinite(tensor)).sum())
    if bad:
        raise ValueError(f"{label} holds {bad} NaN/inf values")
    return tensor


def c2st(
    samples_p: ArrayLike, samples_q: ArrayLike, seed: int = 1, n_folds: int = 5,
    processes: int = 1,
) -> float:  # fmt: skip
    """Mean cross-validated accuracy of a classifier telling ``samples_p`` (the reference) from
    ``samples_q``; 0.5 means indistinguishable. ``processes``: folds trained at once."""
    import joblib
    from sbi.utils.metrics import c2st as sbi_c2st

    p = _as_tensor(samples_p, "reference samples")
    q = _as_tensor(samples_q, "samples")
    if p.shape[1] != q.shape[1]:
        raise ValueError(f"sample dimensions differ: {p.shape[1]} vs {q.shape[1]}")
    jobs = max(1, min(processes, n_folds))
    with joblib.parallel_config(backend="loky", n_jobs=jobs):  # sbi leaves n_jobs to this
        score = sbi_c2st(
            p, q, seed=seed, n_folds=n_folds, classifier="mlp",
            classifier_kwargs=sbibm_classifier(p.shape[1]),
        )  # fmt: skip
    return float(score)


SMALL_C2ST = 20_000
"""samples × dimensions per side under which a machine of ≤ 3 usable CPUs keeps the folds in
one process: there the pool's start (~2 s on 2 cores, the first time in a process) costs more
than its two or three processes save (1,000 + 1,000 2-d samples: 4.5 s in one process)."""


def fold_processes(samples: int, dim: int, usable: int) -> int:
    """How many processes an evaluation's C2ST trains its folds in."""
    if usable <= 3 and samples * dim < SMALL_C2ST:
        return 1
    return usable


def usable_processes() -> int:
    """The CPUs this process may run on (a cpuset or taskset may allow fewer than the machine
    has): how many folds an evaluation trains at once."""
    import os

    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1
