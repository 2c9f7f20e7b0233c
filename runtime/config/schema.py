"""The recipe's schema: one typed section per component (``run``, ``scaling``, ``train``,
``precision``, ``checkpoint``, ``tracking``), each field with its default and a docstring.
``workload`` is a tagged union whose ``kind`` picks the workload's own schema
(``runtime/workloads``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING


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
