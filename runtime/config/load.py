"""Recipe loading: YAML recipe + CLI dotlist overrides → one typed, validated config.

Each component owns a small section of the schema (``schema.py``) and is handed only that
section. ``workload`` is a tagged union: its ``kind`` picks the schema (see
``trainforge.workloads``).

Every user mistake becomes a single :class:`RecipeError` that names the key.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import is_dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    GrammarParseError,
    InterpolationResolutionError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

from trainforge.config.schema import Recipe
from trainforge.errors import RecipeError

CHOICES = {
    "scaling.use_gpu": ("auto", "true", "false"),
    "scaling.placement_strategy": ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"),
    "train.optimizer": ("adamw", "adam", "sgd"),
    "train.schedule": ("constant", "cosine", "linear"),
    "train.lr_scaling": ("none", "linear", "sqrt"),
    "precision.dtype": ("fp32", "bf16", "fp16"),
    "precision.compile_mode": ("default", "reduce-overhead", "max-autotune-no-cudagraphs"),
}


def load(recipe_path: str | Path, overrides: list[str] | tuple[str, ...] = ()) -> DictConfig:
    """Load a recipe file, apply ``key=value`` overrides, and validate. Raises RecipeError."""
    path = Path(recipe_path)
    if not path.is_file():
        raise RecipeError(f"recipe not found: {path}")
    try:
        user = OmegaConf.load(path)
    except (OmegaConfBaseException, OSError, ValueError, yaml.YAMLError) as exc:
        raise RecipeError(f"cannot read recipe {path}: {_first_line(exc)}") from None
    if not isinstance(user, DictConfig):
        raise RecipeError(f"recipe {path} must be a mapping of sections, not a list")
    cli = _parse_overrides(overrides)
    return build(OmegaConf.merge(user, cli))


def from_container(data: dict[str, Any]) -> DictConfig:
    """Rebuild the typed config from a plain dict (how workers receive it)."""
    return build(OmegaConf.create(data))


def build(user: DictConfig) -> DictConfig:
    """Merge user values onto the typed defaults, pick the workload schema, validate."""
    from trainforge.workloads import workload_schema  # the registry imports workload configs

    for name in Recipe.__dataclass_fields__:
        if name in user and name != "workload" and not isinstance(user[name], DictConfig):
            raise RecipeError(f"{name}: must be a section of settings, got {user[name]!r}")
    workload_user = user.get("workload") if "workload" in user else None
    body = OmegaConf.masked_copy(user, [k for k in user if k != "workload"])
    cfg = _merge(OmegaConf.structured(Recipe), body)

    kind = _workload_kind(workload_user)
    schema = workload_schema(kind)
    workload = _merge(OmegaConf.structured(schema), workload_user, prefix="workload")
    with _key_errors("workload"):
        cfg.workload = workload
    OmegaConf.set_readonly(cfg, False)
    _check_missing(cfg)
    check_values(cfg)
    return cfg


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=True)


def to_container(cfg: DictConfig) -> dict[str, Any]:
    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    return data


def global_batch(cfg: DictConfig) -> int:
    """Samples per optimizer step across all workers."""
    return cfg.train.batch_size * cfg.scaling.num_workers * cfg.train.grad_accum_steps


def check_values(cfg: DictConfig) -> None:
    """Impossible values, each named by its key. Resource checks against the cluster live in
    ``trainforge.launch`` (they need a connection to Ray)."""
    # YAML reads `use_gpu: true` as a bool; the schema keeps it as text.
    cfg.scaling.use_gpu = str(cfg.scaling.use_gpu).lower()
    for key, choices in CHOICES.items():
        value = str(OmegaConf.select(cfg, key))
        if value not in choices:
            raise RecipeError(f"{key}: {value!r} is not one of {', '.join(choices)}")
    positive = {
        "scaling.num_workers": 1,
        "scaling.timeout_s": 1,
        "train.epochs": 1,
        "train.batch_size": 1,
        "train.grad_accum_steps": 1,
        "train.eval_every_epochs": 1,
        "train.lr_reference_batch": 1,
        "train.log_every_steps": 1,
        "checkpoint.every_epochs": 1,
        "checkpoint.keep_last": 1,
    }
    for key, low in positive.items():
        value = OmegaConf.select(cfg, key)
        if value < low:
            raise RecipeError(f"{key}: must be >= {low}, got {value}")
    if cfg.tracking.profile_steps < 0 or cfg.tracking.profile_start_step < 0:
        raise RecipeError("tracking.profile_steps and tracking.profile_start_step must be >= 0")
    if cfg.tracking.system_metrics_interval_s <= 0:
        raise RecipeError(
            f"tracking.system_metrics_interval_s: must be > 0, got "
            f"{cfg.tracking.system_metrics_interval_s}"
        )
    for key in ("train.max_steps", "checkpoint.every_steps"):
        value = OmegaConf.select(cfg, key)
        if value is not None and value < 1:
            raise RecipeError(f"{key}: must be >= 1 (or null), got {value}")
    train = cfg.train
    if not (train.lr > 0 and math.isfinite(train.lr)):
        raise RecipeError(f"train.lr: must be > 0, got {train.lr}")
    if train.weight_decay < 0:
        raise RecipeError(f"train.weight_decay: must be >= 0, got {train.weight_decay}")
    if train.early_stopping_patience < 0:
        raise RecipeError(
            f"train.early_stopping_patience: must be >= 0, got {train.early_stopping_patience}"
        )
    if train.warmup_steps < 0:
        raise RecipeError(f"train.warmup_steps: must be >= 0, got {train.warmup_steps}")
    if not 0 <= train.min_lr_ratio <= 1:
        raise RecipeError(f"train.min_lr_ratio: must be in [0, 1], got {train.min_lr_ratio}")
    if train.clip_grad_norm is not None and train.clip_grad_norm <= 0:
        raise RecipeError(
            f"train.clip_grad_norm: must be > 0 (or null), got {train.clip_grad_norm}"
        )
    if cfg.precision.cuda_graphs:
        if train.grad_accum_steps != 1:
            raise RecipeError("precision.cuda_graphs: needs train.grad_accum_steps=1")
        if cfg.precision.dtype == "fp16":
            raise RecipeError("precision.cuda_graphs: not with fp16 (loss scaling); use bf16")
        if cfg.precision.compile:
            raise RecipeError("precision.cuda_graphs: choose it or precision.compile, not both")
        if train.optimizer not in ("adam", "adamw"):
            raise RecipeError("precision.cuda_graphs: needs train.optimizer adam or adamw")
    if cfg.run.max_failures < -1:
        raise RecipeError(f"run.max_failures: must be >= -1, got {cfg.run.max_failures}")
    if not cfg.run.name.strip() or "/" in cfg.run.name:
        raise RecipeError(f"run.name: must be a non-empty name without '/', got {cfg.run.name!r}")
    for resource, amount in cfg.scaling.resources_per_worker.items():
        if amount < 0:
            raise RecipeError(
                f"scaling.resources_per_worker.{resource}: must be >= 0, got {amount}"
            )
    if cfg.scaling.use_gpu == "false" and cfg.scaling.resources_per_worker.get("GPU", 0) > 0:
        raise RecipeError("scaling.resources_per_worker.GPU: set, but scaling.use_gpu is false")

    from trainforge.workloads import check_workload

    check_workload(cfg.workload, cfg.precision)


def scaled_lr(train: Any, global_batch_size: int) -> float:
    """The learning rate after ``train.lr_scaling`` for this global batch."""
    ratio = global_batch_size / train.lr_reference_batch
    if train.lr_scaling == "linear":
        return train.lr * ratio
    if train.lr_scaling == "sqrt":
        return train.lr * math.sqrt(ratio)
    return train.lr


# --- helpers -------------------------------------------------------------------------------


def _parse_overrides(overrides: list[str] | tuple[str, ...]) -> DictConfig:
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise RecipeError(f"override {item!r}: expected key=value (e.g. train.lr=0.01)")
    try:
        return OmegaConf.from_dotlist(list(overrides))
    except (OmegaConfBaseException, ValueError) as exc:
        raise RecipeError(f"cannot parse overrides: {_first_line(exc)}") from None


def _workload_kind(workload_user: Any) -> str:
    if workload_user is None:
        raise RecipeError("workload: missing; the recipe needs a workload section with a kind")
    if not isinstance(workload_user, DictConfig):
        raise RecipeError("workload: must be a mapping with a kind (e.g. kind: cnn)")
    kind = workload_user.get("kind")
    if kind is None:
        raise RecipeError("workload.kind: missing required value (e.g. cnn)")
    return str(kind)


def _merge(base: DictConfig, user: Any, prefix: str = "") -> DictConfig:
    if user is None:
        return base
    with _key_errors(prefix, schema=base):
        return OmegaConf.merge(base, user)  # type: ignore[return-value]


class _key_errors:
    """Turn OmegaConf's merge/validation errors into one RecipeError naming the full key."""

    def __init__(self, prefix: str, schema: DictConfig | None = None) -> None:
        self.prefix = prefix
        self.schema = schema

    def __enter__(self) -> None:
        return None

    def __exit__(self, exc_type: Any, exc: BaseException | None, tb: Any) -> bool:
        if exc is None or not isinstance(exc, OmegaConfBaseException):
            return False
        key = _full_key(self.prefix, getattr(exc, "full_key", "") or "")
        if isinstance(exc, ConfigKeyError | ConfigAttributeError):
            raise RecipeError(f"{key}: unknown key{self._did_you_mean(key)}") from None
        if isinstance(exc, ValidationError):
            value = getattr(exc, "value", None)
            expected = _expected_type(exc)
            raise RecipeError(f"{key}: wrong type, got {value!r}{expected}") from None
        if isinstance(exc, GrammarParseError | InterpolationResolutionError):
            raise RecipeError(f"{key}: {_first_line(exc)}") from None
        raise RecipeError(f"{key or 'recipe'}: {_first_line(exc)}") from None

    def _did_you_mean(self, key: str) -> str:
        if self.schema is None:
            return ""
        candidates = _all_keys(self.schema, self.prefix)
        close = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
        if not close:
            # A wrong section is common (lr under run:): match the last part alone too.
            leaf = key.rsplit(".", 1)[-1]
            close = [c for c in candidates if c.rsplit(".", 1)[-1] == leaf][:1]
        return f" (did you mean '{close[0]}'?)" if close else ""


def _all_keys(node: Any, prefix: str) -> list[str]:
    keys: list[str] = []
    if isinstance(node, DictConfig):
        for name in node:
            full = _full_key(prefix, str(name))
            keys.append(full)
            child = node._get_node(name)
            # Recurse into schema sections only: resources_per_worker is a free-form mapping.
            if isinstance(child, DictConfig) and is_dataclass(OmegaConf.get_type(child)):
                keys.extend(_all_keys(child, full))
    return keys


def _full_key(prefix: str, key: str) -> str:
    key = str(key)
    if prefix and key and not key.startswith(prefix + "."):
        return f"{prefix}.{key}"
    return key or prefix


def _expected_type(exc: ValidationError) -> str:
    text = str(exc).splitlines()[0]
    # OmegaConf says e.g. "Value 'abc' of type 'str' could not be converted to Integer"
    if "could not be converted to" in text:
        return ", expected " + text.split("could not be converted to", 1)[1].strip().lower()
    if "Invalid type assigned" in text or "is not a subclass" in text:
        return f" ({text})"
    return f" ({text})"


def _check_missing(cfg: DictConfig, prefix: str = "") -> None:
    for key in cfg:
        full = _full_key(prefix, str(key))
        if OmegaConf.is_missing(cfg, key):
            raise RecipeError(f"{full}: missing required value")
        child = cfg._get_node(key)
        if isinstance(child, DictConfig):
            _check_missing(child, full)
        elif isinstance(child, ListConfig):
            continue
    try:
        OmegaConf.to_container(cfg, resolve=True, throw_on_missing=True)
    except MissingMandatoryValue as exc:
        raise RecipeError(f"{getattr(exc, 'full_key', 'recipe')}: missing required value") from None
    except InterpolationResolutionError as exc:
        raise RecipeError(f"{getattr(exc, 'full_key', 'recipe')}: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
