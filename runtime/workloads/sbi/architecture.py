"""What decides an estimator's architecture, as plain data: the builder names recipes may use,
the embedding nets, their checks and the ``BuildRecord`` that goes with every checkpoint. No
torch: the driver checks an SBI recipe with these (``estimator.py`` builds the networks)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from trainforge.errors import RecipeError, did_you_mean
from trainforge.workloads.sbi import methods
from trainforge.workloads.user_code import is_import_path

ESTIMATORS = (
    "maf",
    "nsf",
    "mdn",
    "made",
    "maf_rqs",
    "zuko_maf",
    "zuko_nsf",
    "zuko_nice",
    "zuko_naf",
    "zuko_gf",
    "zuko_bpf",
)
OTHER_MODELS = tuple(dict.fromkeys(n for m in methods.METHODS.values() for n in m.models))
"""Builder names of the methods whose estimator is no density (nre's classifiers)."""
EMBEDDINGS = ("none", "fully_connected", "cnn", "permutation_invariant")
Z_SCORES = ("independent", "structured", "none")


@dataclass
class BuildRecord:
    """Everything besides the weights that decides the estimator's architecture."""

    model: str
    dim_theta: int
    dim_x: int
    hidden_features: int
    num_transforms: int
    num_bins: int
    num_components: int
    z_score_theta: str
    z_score_x: str
    embedding: str
    embedding_features: int
    embedding_hidden: int
    embedding_input_shape: list[int] = field(default_factory=list)
    embedding_kwargs: dict[str, Any] = field(default_factory=dict)
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    code_dir: str | None = None
    """Where the user's modules were found (a builder or an embedding by import path)."""
    method: str = "npe"
    """``workload.method``: which of sbi's builders (posterior or likelihood) made it; a record
    without one is NPE's."""

    @classmethod
    def from_config(
        cls, estimator_cfg: Any, dim_theta: int, dim_x: int, code_dir: str | None = None,
        method: str = "npe",
    ) -> BuildRecord:  # fmt: skip
        names = cls.__dataclass_fields__.keys() - {"dim_theta", "dim_x", "code_dir", "method"}
        values = {name: getattr(estimator_cfg, name) for name in names}
        values["model"] = values["model"] or methods.get(method).default_model
        values["embedding_input_shape"] = [int(v) for v in values["embedding_input_shape"]]
        values["embedding_kwargs"] = dict(values["embedding_kwargs"])
        values["model_kwargs"] = dict(values["model_kwargs"])
        return cls(dim_theta=dim_theta, dim_x=dim_x, code_dir=code_dir, method=method, **values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def check(estimator_cfg: Any) -> None:
    model, known = estimator_cfg.model, ESTIMATORS + OTHER_MODELS
    if model is not None and model not in known and not is_import_path(model):
        raise RecipeError(
            f"workload.estimator.model: {model!r} is not a known estimator"
            f"{did_you_mean(model, known)}; choose one of: "
            + ", ".join(known)
            + ", or your own builder by import path (my_pkg.flows:build)"
        )
    if estimator_cfg.embedding not in EMBEDDINGS and not is_import_path(estimator_cfg.embedding):
        raise RecipeError(
            f"workload.estimator.embedding: {estimator_cfg.embedding!r} is not one of "
            + ", ".join(EMBEDDINGS)
            + " or your own net by import path (my_pkg.module:MyNet)"
        )
    if estimator_cfg.embedding_kwargs and not is_import_path(estimator_cfg.embedding):
        raise RecipeError(
            "workload.estimator.embedding_kwargs: arguments for your own embedding net "
            f"(embedding by import path); {estimator_cfg.embedding} takes none"
        )
    for key in ("z_score_theta", "z_score_x"):
        if getattr(estimator_cfg, key) not in Z_SCORES:
            raise RecipeError(
                f"workload.estimator.{key}: {getattr(estimator_cfg, key)!r} is not one of "
                + ", ".join(Z_SCORES)
            )
    for key in ("hidden_features", "num_transforms", "num_bins", "num_components"):
        value = getattr(estimator_cfg, key)
        if value < 1:
            raise RecipeError(f"workload.estimator.{key}: must be >= 1, got {value}")
    shape = list(estimator_cfg.embedding_input_shape)
    if estimator_cfg.embedding == "cnn" and len(shape) not in (1, 2, 3):
        raise RecipeError(
            "workload.estimator.embedding_input_shape: the cnn embedding needs the shape of one "
            "x, e.g. [32, 32] or [3, 32, 32]"
        )
    if estimator_cfg.embedding == "permutation_invariant" and len(shape) != 2:
        raise RecipeError(
            "workload.estimator.embedding_input_shape: permutation_invariant needs "
            "[set_size, features_per_element]"
        )


def check_shape(shape: list[int], dim_x: int) -> None:
    """An embedding's input shape must hold exactly one x."""
    if shape and math.prod(shape) != dim_x:
        raise RecipeError(
            f"workload.estimator.embedding_input_shape: {shape} holds {math.prod(shape)} "
            f"values, but x has {dim_x}"
        )
