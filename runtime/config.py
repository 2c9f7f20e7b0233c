"""Recipe schema and loading: YAML recipe + CLI dotlist overrides → one typed, validated config.

Each component owns a small section (``run``, ``scaling``, ``train``, ``precision``,
``checkpoint``, ``tracking``, ``workload``) and is handed only that section. ``workload`` is a
tagged union: its ``kind`` picks the schema (see ``runtime.workloads``).

Every user mistake becomes a single :class:`RecipeError` that names the key.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import dataclass, field, is_dataclass
from pathlib import Path
from typing import Any

import yaml
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf
from omegaconf.errors import (
    ConfigAttributeError,
    ConfigKeyError,
    GrammarParseError,
    InterpolationResolutionError,
    MissingMandatoryValue,
    OmegaConfBaseException,
    ValidationError,
)

from runtime.errors import RecipeError


@dataclass
class RunSection:
    name: str = MISSING
    """Run identity: names the Ray Train run directory and the MLflow run. Re-running the same
    name resumes that run."""
    seed: int = 0
    """Seed for model init, data order and augmentation (every rank derives its own from it)."""
    storage_path: str = "./runs"
    """Where checkpoints and Ray Train run state live. Shared storage (NFS, S3) for multi-node."""
    max_failures: int = 0
    """Worker-group restarts Ray Train attempts after a failure (each resumes from the latest
    checkpoint); -1 retries forever."""


@dataclass
class ScalingSection:
    num_workers: int = 1
    """Training workers (DDP ranks): one per GPU, or CPU slots when there is no GPU."""
    use_all_gpus: bool = False
    """One worker per GPU of the Ray cluster (overrides num_workers; needs GPUs)."""
    use_gpu: str = "auto"
    """auto (GPU when the cluster has one) | true | false."""
    resources_per_worker: dict[str, float] = field(default_factory=dict)
    """Ray resources each worker reserves, e.g. {CPU: 8, GPU: 1}. Empty: 1 CPU (+1 GPU)."""
    placement_strategy: str = "PACK"
    """PACK | SPREAD | STRICT_PACK | STRICT_SPREAD (Ray placement group strategy)."""
    timeout_s: int = 1800
    """Process-group (NCCL/gloo) timeout in seconds."""


@dataclass
class TrainSection:
    epochs: int = 1
    """Passes over the training set (ignored when max_steps is set)."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (overrides epochs)."""
    batch_size: int = 64
    """Per-worker micro-batch. Global batch = batch_size × num_workers × grad_accum_steps."""
    grad_accum_steps: int = 1
    """Micro-batches accumulated per optimizer step (gradients all-reduced on the last only)."""
    optimizer: str = "adamw"
    """adamw | adam | sgd."""
    lr: float = 1e-3
    """Peak learning rate."""
    weight_decay: float = 0.0
    """Decoupled (adamw) or L2 (adam, sgd) weight decay."""
    momentum: float = 0.9
    """sgd momentum (Nesterov)."""
    schedule: str = "constant"
    """constant | cosine | linear (decay after warmup, to min_lr_ratio × lr)."""
    warmup_steps: int = 0
    """Linear warmup from 0 over this many optimizer steps."""
    min_lr_ratio: float = 0.0
    """Final LR of cosine/linear decay as a fraction of lr."""
    clip_grad_norm: float | None = None
    """Clip the global gradient norm to this value (None: no clipping; the norm is still logged)."""
    eval_every_epochs: int = 1
    """Evaluate on the validation split every N epochs (and always at the end)."""
    early_stopping_patience: int = 0
    """Stop when val/loss has not improved for this many evaluations (0: off). The decision is
    all-reduced, so every rank stops at the same epoch."""
    restore_best: bool = False
    """At the end, put back the weights of the evaluation with the lowest val/loss (kept in
    memory and in checkpoints)."""
    lr_scaling: str = "none"
    """none | linear | sqrt: scale lr by (global batch / lr_reference_batch) or its square root,
    for large-batch training."""
    lr_reference_batch: int = 256
    """The global batch at which lr is the recipe's lr (see lr_scaling)."""
    log_every_steps: int = 20
    """Print progress and report training metrics every N optimizer steps."""


@dataclass
class PrecisionSection:
    dtype: str = "fp32"
    """fp32 | bf16 (autocast) | fp16 (autocast + GradScaler)."""
    tf32: bool = True
    """Allow TF32 matmuls/convolutions on Ampere+ GPUs."""
    channels_last: bool = False
    """NHWC memory format for convolution models (faster with tensor cores)."""
    compile: bool = False
    """torch.compile the model (the first steps pay the compilation)."""
    cuda_graphs: bool = False
    """Capture the whole optimizer step (forward, backward, clipping, optimizer) as one CUDA
    graph and replay it: for small, launch-bound models such as SBI flows. GPU workers (with
    several, DDP's all-reduce is captured too), no gradient accumulation, not with fp16."""
    compile_mode: str = "default"
    """default | reduce-overhead (CUDA graphs: for small, launch-bound models) |
    max-autotune-no-cudagraphs."""


@dataclass
class CheckpointSection:
    every_epochs: int = 1
    """Save a checkpoint every N epochs (and at the end)."""
    every_steps: int | None = None
    """Also save every N optimizer steps within an epoch (resume continues mid-epoch)."""
    keep_last: int = 2
    """Checkpoints kept on storage (older ones are deleted by Ray Train)."""
    resume: bool = True
    """Resume from the run's latest checkpoint when run.name already exists; false refuses to
    touch an existing run."""


@dataclass
class TrackingSection:
    enabled: bool = True
    """Record the run in MLflow."""
    tracking_uri: str | None = None
    """MLflow tracking URI; default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the
    working directory."""
    experiment: str = "trainforge"
    """MLflow experiment name."""
    system_metrics: bool = True
    """CPU, memory, disk, network and GPU metrics from every node (system/node_N/…)."""
    system_metrics_interval_s: float = 10.0
    """Seconds between system metric samples."""
    log_model: bool = True
    """Log the final model with mlflow.pytorch.log_model (the state dict is always logged)."""
    profile_steps: int = 0
    """Profile this many optimizer steps on rank 0 with torch.profiler and log the Chrome trace."""
    profile_start_step: int = 5
    """First optimizer step of the profiling window (after warm-up)."""


@dataclass
class Recipe:
    run: RunSection = field(default_factory=RunSection)
    scaling: ScalingSection = field(default_factory=ScalingSection)
    train: TrainSection = field(default_factory=TrainSection)
    precision: PrecisionSection = field(default_factory=PrecisionSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    tracking: TrackingSection = field(default_factory=TrackingSection)
    workload: Any = None
    """Tagged union selected by workload.kind (cnn, …)."""


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
    from runtime.workloads import workload_schema  # the registry imports workload configs

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
    ``runtime.launch`` (they need a connection to Ray)."""
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

    from runtime.workloads import check_workload

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
