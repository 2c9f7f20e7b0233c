"""The recipe's schema: one typed section per component (``run``, ``scaling``, ``train``,
``precision``, ``checkpoint``, ``tracking``), each field with its default and a docstring.
``workload`` is a tagged union whose ``kind`` picks the workload's own schema
(``runtime/workloads``).

Choices are ``Literal`` aliases (OmegaConf validates them while merging; ``Section`` again when
a section is built in code). Each section checks its own values in ``check``; ``Recipe`` checks
the few rules that span sections.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from omegaconf import MISSING

from trainforge.config.rules import Section
from trainforge.errors import RecipeError
from trainforge.tracking.client import redact, uri_problem

MAX_NAME_BYTES = 200  # of a run name: a file name holds 255, the lock file adds 6
# Seconds a wait may last: a year is more than any wait means, and below what the clocks that
# take it hold (a timedelta, MLflow's sampling thread: larger values overflow in the worker).
MAX_WAIT_S = 365 * 24 * 3600

# auto | true | false. YAML and the command line read `true` as a bool; the loader turns a
# bool given for a Switch into its text before merging (see load._switches_as_text).
Switch = Literal["auto", "true", "false"]
Placement = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
Optimizer = Literal["adamw", "adam", "sgd"]
Schedule = Literal["constant", "cosine", "linear", "plateau"]
LrScaling = Literal["none", "linear", "sqrt"]
Dtype = Literal["fp32", "bf16", "fp16"]
CompileMode = Literal["default", "reduce-overhead", "max-autotune-no-cudagraphs"]
Search = Literal["optuna", "random", "grid"]
TrialScheduler = Literal["asha", "fifo"]
Direction = Literal["auto", "min", "max"]


@dataclass
class RunSection(Section):
    KEY = "run"

    name: str = MISSING
    """Run identity: names the run's folder under storage_path and the MLflow run. Re-running the
    same name resumes that run."""
    seed: int = 0
    """Seed for model init, data order and augmentation (every rank derives its own from it)."""
    storage_path: str = "./runs"
    """Where run folders live (checkpoints, worker output, the run lock). Shared storage (NFS,
    S3) for multi-node."""
    max_failures: int = 0
    """Restarts of the run's workers after a failure, on every worker group (each resumes from
    the latest checkpoint); -1 restarts without limit."""

    def check(self) -> None:
        name = self.name
        # It names a folder and, beside it, the lock file `.<name>.lock`: one file name each.
        if not name.strip() or "/" in name or name in (".", "..") or not name.isprintable():
            raise RecipeError(
                "run.name: must be a non-empty name without '/' or control characters, not '.' "
                f"or '..' (it names a folder), got {name!r}"
            )
        if len(name.encode()) > MAX_NAME_BYTES:
            raise RecipeError(
                f"run.name: must be at most {MAX_NAME_BYTES} bytes (it names a folder), got "
                f"{len(name.encode())}"
            )
        if not 0 <= self.seed < 2**32:  # numpy's and scikit-learn's seeds are uint32
            raise RecipeError(f"run.seed: must be in [0, 2**32 - 1], got {self.seed}")
        self.at_least("max_failures", -1)


@dataclass
class ScalingSection(Section):
    KEY = "scaling"

    num_workers: int = 1
    """Training workers (DDP ranks): one per GPU, or CPU slots when there is no GPU."""
    use_all_gpus: bool = False
    """One worker per GPU of the Ray cluster (overrides num_workers; needs GPUs)."""
    use_gpu: Switch = "auto"
    """auto (GPU when the cluster has one) | true | false. ``resolve`` decides auto."""
    resources_per_worker: dict[str, float] = field(default_factory=dict)
    """Ray resources each worker reserves, e.g. {CPU: 8, GPU: 1}. Empty: 1 CPU (+1 GPU)."""
    placement_strategy: Placement = "PACK"
    """PACK | SPREAD | STRICT_PACK | STRICT_SPREAD (Ray placement group strategy)."""
    timeout_s: int = 1800
    """Process-group (NCCL/gloo) timeout in seconds."""

    def check(self) -> None:
        self.at_least("num_workers", 1)
        self.at_least("timeout_s", 1)
        self.at_most("timeout_s", MAX_WAIT_S, "a year")
        for resource, amount in self.resources_per_worker.items():
            if amount < 0:
                raise RecipeError(
                    f"scaling.resources_per_worker.{resource}: must be >= 0, got {amount}"
                )
        if self.use_gpu == "false" and self.resources_per_worker.get("GPU", 0) > 0:
            raise RecipeError("scaling.resources_per_worker.GPU: set, but scaling.use_gpu is false")


@dataclass
class TrainSection(Section):
    KEY = "train"

    epochs: int | None = 1
    """Passes over the training set (ignored when max_steps is set); null: until early stopping
    ends the run."""
    max_steps: int | None = None
    """Stop after this many optimizer steps (overrides epochs)."""
    batch_size: int = 64
    """Per-worker micro-batch. Global batch = batch_size × num_workers × grad_accum_steps."""
    grad_accum_steps: int = 1
    """Micro-batches accumulated per optimizer step (gradients all-reduced on the last only)."""
    optimizer: Optimizer = "adamw"
    """adamw | adam | sgd."""
    lr: float = 1e-3
    """Peak learning rate."""
    weight_decay: float = 0.0
    """Decoupled (adamw) or L2 (adam, sgd) weight decay."""
    momentum: float = 0.9
    """sgd momentum (Nesterov)."""
    schedule: Schedule = "constant"
    """constant | cosine | linear (decay after warmup, to min_lr_ratio × lr) | plateau (×
    plateau_factor whenever val/loss has not improved for plateau_patience evaluations, down to
    min_lr_ratio × lr: for runs that early stopping ends)."""
    warmup_steps: int = 0
    """Linear warmup from 0 over this many optimizer steps."""
    min_lr_ratio: float = 0.0
    """Final LR of cosine/linear decay, or the lowest of plateau, as a fraction of lr."""
    plateau_patience: int = 5
    """plateau: evaluations without a new best val/loss before the LR falls."""
    plateau_factor: float = 0.5
    """plateau: what the LR is multiplied by each time it falls."""
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
    lr_scaling: LrScaling = "none"
    """none | linear | sqrt: scale lr by (global batch / lr_reference_batch) or its square root,
    for large-batch training."""
    lr_reference_batch: int = 256
    """The global batch at which lr is the recipe's lr (see lr_scaling)."""
    log_every_steps: int = 20
    """Print progress and report training metrics every N optimizer steps."""

    def check(self) -> None:
        for name in ("epochs", "batch_size", "grad_accum_steps", "eval_every_epochs",
                     "lr_reference_batch", "log_every_steps", "max_steps"):  # fmt: skip
            self.at_least(name, 1)
        for name in ("weight_decay", "early_stopping_patience", "warmup_steps"):
            self.at_least(name, 0)
        self.positive("lr")
        self.positive("clip_grad_norm")
        if not 0 <= self.momentum < 1:  # torch refuses < 0; 1 and above never decay
            raise RecipeError(f"train.momentum: must be in [0, 1), got {self.momentum}")
        self.fraction("min_lr_ratio", closed=True)
        self.at_least("plateau_patience", 1)
        self.fraction("plateau_factor")
        patience = self.early_stopping_patience
        if self.epochs is None and not self.max_steps:
            if patience == 0:
                raise RecipeError(
                    "train.epochs: null trains until early stopping ends the run, and "
                    "train.early_stopping_patience is 0 (off): set it, or train.epochs, or "
                    "train.max_steps"
                )
            if self.schedule in ("cosine", "linear"):
                raise RecipeError(
                    f"train.schedule={self.schedule}: decays over the run's length, and "
                    "train.epochs is null (until early stopping): set train.epochs or "
                    "train.max_steps, or use schedule constant or plateau"
                )
        if self.schedule == "plateau" and 0 < patience <= self.plateau_patience:
            raise RecipeError(
                f"train.schedule=plateau: train.early_stopping_patience ({patience}) must be "
                f"larger than train.plateau_patience ({self.plateau_patience}), or the run stops "
                "before its learning rate ever falls"
            )


@dataclass
class PrecisionSection(Section):
    KEY = "precision"

    dtype: Dtype = "fp32"
    """fp32 | bf16 (autocast) | fp16 (autocast + GradScaler)."""
    tf32: bool = True
    """Allow TF32 matmuls/convolutions on Ampere+ GPUs."""
    cudnn_benchmark: bool = True
    """Let cuDNN time its algorithms for each new convolution shape, on its first use, and keep
    the fastest (``torch.backends.cudnn.benchmark``): a cold worker's first step pays for it."""
    channels_last: bool = False
    """NHWC memory format for convolution models (faster with tensor cores)."""
    compile: bool = False
    """torch.compile the model (the first steps pay the compilation)."""
    cuda_graphs: Switch = "false"
    """false | true | auto. Capture the whole optimizer step (forward, backward, clipping,
    optimizer update; with several GPU workers DDP's all-reduce too) as one CUDA graph and
    replay it: for launch-bound steps (SBI flows, ResNet-18 on CIFAR-sized images). Every
    optimizer (sgd, adam, adamw), with the LR schedule. Not with gradient accumulation, fp16 or
    precision.compile, and GPU workers only: ``true`` refuses those recipes; ``auto`` takes
    eager steps then, and when the training data streams through a DataLoader, saying why in
    one line."""
    compile_mode: CompileMode = "default"
    """default | reduce-overhead (CUDA graphs: for small, launch-bound models) |
    max-autotune-no-cudagraphs."""


@dataclass
class CheckpointSection(Section):
    KEY = "checkpoint"

    every_epochs: int = 1
    """Save a checkpoint every N epochs (and at the end)."""
    every_steps: int | None = None
    """Also save every N optimizer steps within an epoch (resume continues mid-epoch)."""
    keep_last: int = 2
    """Checkpoints kept in the run's folder; the oldest is deleted as each new one arrives."""
    resume: bool = True
    """Resume from the run's latest checkpoint when run.name already exists; false refuses to
    touch an existing run."""
    allow_changes: bool = False
    """Resume even though the recipe differs from the one the run's latest checkpoint was
    trained with (the changed keys are printed). Without it such a resume is refused, naming
    them; keys that cannot change results pass (see ``trainforge.driver.recipe_change``)."""

    def check(self) -> None:
        for name in ("every_epochs", "every_steps", "keep_last"):
            self.at_least(name, 1)


@dataclass
class TrackingSection(Section):
    KEY = "tracking"

    enabled: bool = True
    """Record the run in MLflow."""
    tracking_uri: str | None = None
    """MLflow tracking URI; default: $MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the
    working directory."""
    experiment: str = "trainforge"
    """MLflow experiment name."""
    system_metrics: bool = True
    """CPU, memory, disk, network and GPU metrics from every node (system/node_N/…)."""
    system_metrics_interval_s: float = 2.0
    """Seconds between system metric samples (MLflow's ``sampling_interval``; its default, 10 s,
    left a run that trains a few seconds with none)."""
    log_model: bool = True
    """Log the final model with mlflow.pytorch.log_model (the state dict is always logged)."""
    profile_steps: int = 0
    """Profile this many optimizer steps on rank 0 with torch.profiler and log the Chrome trace."""
    profile_start_step: int = 5
    """First optimizer step of the profiling window (after warm-up). With CUDA graphs the first
    3 steps (11 under DDP) are eager and the next one captures: start after them for replays."""

    def check(self) -> None:
        uri = self.tracking_uri
        problem = uri_problem(uri) if uri is not None else None
        if uri is not None and problem:
            raise RecipeError(f"tracking.tracking_uri: {redact(uri)!r} {problem}")
        self.at_least("profile_steps", 0)
        self.at_least("profile_start_step", 0)
        self.positive("system_metrics_interval_s")
        self.at_most("system_metrics_interval_s", MAX_WAIT_S, "a year")


@dataclass
class WorkloadSection(Section):
    """What every workload's schema starts with: the tag that selects it. Each family
    subclasses it (``trainforge.workloads.<family>.config``)."""

    KEY = "workload"

    kind: str = MISSING
    """Workload family tag (cnn, sbi, …); selects the schema of the rest of the section."""


@dataclass
class SweepSection(Section):
    """`trainforge sweep`: trials of this recipe with settings drawn from ``space``, searched
    and stopped early on Ray Tune. `trainforge train` trains the recipe as written."""

    KEY = "sweep"
    FREE_FORM = ("space",)

    space: dict[str, Any] = field(default_factory=dict)
    """Recipe key → distribution: uniform(low, high), loguniform(low, high), randint(low, high)
    (both ends included) or choice(a, b, …), e.g. ``train.lr: loguniform(1e-4, 1e-1)``."""
    trials: int = 8
    """How many trials the sweep runs (each a whole run, named <run.name>-t<index>); a grid
    search runs its combinations."""
    search: Search = "optuna"
    """How the next trial's settings are picked: optuna (Optuna's TPE, learning from the trials
    so far), random, or grid: every combination of the space's choice() values once (then the
    combinations, not ``trials``, are the trials)."""
    scheduler: TrialScheduler = "asha"
    """asha stops trials whose metric trails the others' at the same epoch (Ray Tune's ASHA);
    fifo runs every trial to its end."""
    metric: str = "val/loss"
    """The metric the sweep compares: one each epoch for asha (val/loss, val/accuracy), or a
    score measured at a run's end (c2st/mean) with fifo."""
    mode: Direction = "auto"
    """min or max of ``metric``; auto: max for accuracy, min for anything else."""
    at_once: int = 0
    """Trials run at the same time; 0: as many as the cluster's CPUs (or GPUs) hold."""
    grace_epochs: int = 1
    """Epochs every trial trains before asha may stop it."""

    def check(self) -> None:
        from trainforge.config import sweep_space

        self.at_least("trials", 1)
        self.at_least("at_once", 0)
        self.at_least("grace_epochs", 1)
        if not self.metric or not all(c.isalnum() or c in "_-.:/ " for c in self.metric):
            raise RecipeError(f"sweep.metric: must be a metric's name such as val/loss, got "
                              f"{self.metric!r}")  # fmt: skip
        sweep_space.parse(self.space)

    def direction(self) -> str:
        if self.mode != "auto":
            return self.mode
        return "max" if "accuracy" in self.metric else "min"


@dataclass
class Recipe:
    """A whole recipe: validated when built, and (after ``config.resolve``) with every value
    the driver decides filled in."""

    run: RunSection = field(default_factory=RunSection)
    scaling: ScalingSection = field(default_factory=ScalingSection)
    train: TrainSection = field(default_factory=TrainSection)
    precision: PrecisionSection = field(default_factory=PrecisionSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    tracking: TrackingSection = field(default_factory=TrackingSection)
    workload: WorkloadSection = field(default_factory=WorkloadSection)
    """Tagged union selected by workload.kind: an instance of that workload's own schema."""
    sweep: SweepSection = field(default_factory=SweepSection)

    def __post_init__(self) -> None:
        check_across_sections(self)


def check_batch_fits(train: TrainSection, num_workers: int, train_samples: int | None) -> None:
    """One optimizer step's micro-batches must fit in a worker's shard of the training split
    (the sampler pads shards to equal size and drops a last partial batch), else an epoch has
    no step. ``train_samples`` None: the size is known only once the data are read."""
    if train_samples is None:
        return
    shard = -(-train_samples // num_workers)
    need = train.batch_size * train.grad_accum_steps
    if need > shard:
        accum = (
            f" × train.grad_accum_steps {train.grad_accum_steps}"
            if need != train.batch_size
            else ""
        )
        raise RecipeError(
            f"train.batch_size: {train.batch_size}{accum} is more than a worker's shard of "
            f"{shard} samples ({train_samples} training samples over {num_workers} workers); "
            "lower train.batch_size or scaling.num_workers, or use more data"
        )


def check_across_sections(recipe: Recipe) -> None:
    """Rules that span sections (a workload's own such rules are its spec's ``check``)."""
    if recipe.precision.cuda_graphs == "true":
        blocker = cuda_graph_blocker(recipe)
        if blocker is not None:
            raise RecipeError(f"precision.cuda_graphs: {blocker}")


def cuda_graph_blocker(recipe: Recipe) -> str | None:
    """Why the recipe's step cannot be captured as a CUDA graph ("needs …"), or None.

    A graph replays one fixed step: no micro-step loop (gradient accumulation), no dynamic loss
    scale (fp16's GradScaler decides on the host whether to step), no second compiler."""
    train, precision = recipe.train, recipe.precision
    if train.grad_accum_steps != 1:
        return "needs train.grad_accum_steps=1"
    if precision.dtype == "fp16":
        return "needs bf16 or fp32 (fp16's loss scaling is not captured)"
    if precision.compile:
        return "needs precision.compile=false"
    if recipe.scaling.use_gpu == "false":
        return "needs GPU workers, and scaling.use_gpu is false"
    return None
