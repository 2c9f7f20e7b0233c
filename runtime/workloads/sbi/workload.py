"""Simulation-based inference as a trainforge workload: the method (``workload.method``: NPE,
NLE, NRE, FMPE, NPSE; ``methods/``) decides what the estimator learns and its loss.

The data are the simulation stage's (θ, x) pairs, split once into training and validation with
a seeded permutation (sbi's split rule: the last ``val_fraction`` of the permutation validates),
identically on every rank; the loop shards the training split. The model is sbi's
estimator inside ``EstimatorLoss``; the loss is its mean per-row loss (−log q(θ | x) for NPE,
−log q(x | θ) for NLE, the contrastive classification loss for NRE, the vector field's
regression loss for FMPE and NPSE).

Precision: SBI trains in fp32 only. The loss is a sum of log-determinants over the flow's
transforms and is compared across epochs to the fourth decimal by early stopping; bf16 keeps
three significant digits. The estimators are also small (tens of thousands of parameters), so
their steps are bound by kernel launches, not arithmetic, and 16-bit math would gain little.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from trainforge import storage
from trainforge.config.schema import PrecisionSection
from trainforge.data.types import Batch, Split, TensorData, keep_on_device
from trainforge.tracking.datasets import TrainingData
from trainforge.workloads.base import Workload
from trainforge.workloads.sbi import estimator as estimators
from trainforge.workloads.sbi import fast_tanh, methods, simulations, sources, stream
from trainforge.workloads.sbi.config import SBIWorkloadConfig
from trainforge.workloads.sbi.split import split_order

# Loading peaks at ~3.4 times the simulations' size (chunks, concatenation, split; measured in
# bench/sbi_stream_memory.py): stream from disk when 4 times it, for every worker on the
# machine, exceeds the available memory.
HOST_COPIES = 4


def split(theta: torch.Tensor, x: torch.Tensor, val_fraction: float, seed: int) -> tuple:
    """sbi's rule (``split.split_order``) applied to simulations in memory."""
    train, val = split_order(len(theta), val_fraction, seed)
    return (theta[train], x[train]), (theta[val], x[val])


class SBIWorkload(Workload):
    # Validation is forward-only through a small network: big batches, few launches per epoch.
    eval_batch_size = 16384
    model_name = "posterior"

    def __init__(self, cfg: SBIWorkloadConfig, seed: int) -> None:
        self.cfg = cfg
        self.seed = seed
        self.info: dict[str, Any] = {}

    def datasets(self, device: torch.device) -> tuple[Split, Split]:
        if self.cfg.simulation.path is None:
            raise RuntimeError("workload.simulation.path unset: run the simulation stage first")
        folder = Path(self.cfg.simulation.path)
        if self._streams(folder):
            return self._streamed(folder, device)
        theta, x = simulations.load(folder, self.cfg.simulation.drop_invalid)
        (train_theta, train_x), (val_theta, val_x) = split(
            theta, x, self.cfg.val_fraction, self.seed
        )
        self.train_theta, self.train_x = train_theta, train_x  # z-scoring statistics
        self.dim_theta, self.dim_x = theta.shape[1], x.shape[1]
        on_device = self._fits(theta, x, device)
        place = (lambda t: t.to(device)) if on_device else (lambda t: t)
        if device.type == "cuda" and not on_device:
            place = lambda t: t.pin_memory()  # noqa: E731 - batches gathered on the host
        self.info = {
            "simulations": len(theta),
            "train_samples": len(train_theta),
            "val_samples": len(val_theta),
            "data_on_device": on_device,
        }
        return (
            TensorData(place(train_theta), place(train_x)),
            TensorData(place(val_theta), place(val_x)),
        )

    def training_data(self) -> TrainingData:
        """Named after the task (or the user's simulator); its digest from the simulation
        cache's key (which hashes the task or the user's code, N, chunking, seed and device)
        with what selects the training rows: invalid rows dropped or not, the split's fraction
        and seed."""
        folder = Path(str(self.cfg.simulation.path))
        manifest = simulations.read_manifest(folder)
        # the cache's key; for a folder made otherwise, what its manifest says of it
        made_of = manifest.get("key") or {k: v for k, v in manifest.items() if k != "created"}
        identity = {
            "simulations": made_of,
            "num_simulations": manifest["num_simulations"],
            "drop_invalid": self.cfg.simulation.drop_invalid,
            "val_fraction": self.cfg.val_fraction,
            "split_seed": self.seed,
        }
        profile = {"val_rows": self.info["val_samples"]} | {
            k: manifest[k] for k in ("num_simulations", "invalid", "dim_theta", "dim_x")
        }
        if manifest.get("failed"):  # of the invalid ones, those whose simulator raised
            profile["failed"] = manifest["failed"]
        return TrainingData.of(
            self._source_name(), identity, self.info["train_samples"], source=str(folder),
            source_type="local", profile=profile,
        )  # fmt: skip

    def _source_name(self) -> str:
        return self.cfg.task if self.cfg.task != sources.CUSTOM else str(self.cfg.simulator)

    def _streams(self, folder: Path) -> bool:
        if self.cfg.stream_from_disk != "auto":
            return self.cfg.stream_from_disk == "true"
        manifest = simulations.read_manifest(folder)
        return not _fits_in_host_memory(manifest["num_simulations"] * _row_bytes(manifest))

    def _streamed(self, folder: Path, device: torch.device) -> tuple[Split, Split]:
        """Training rows read from disk window by window; validation rows in memory (on the
        GPU when they fit there) unless they are too large too."""
        drop_invalid = self.cfg.simulation.drop_invalid
        job = stream.plan(folder, self.cfg.val_fraction, self.seed, drop_invalid)
        manifest = simulations.read_manifest(folder)
        keep_val = _fits_in_host_memory(job.num_val * _row_bytes(manifest))
        estimator = self.cfg.estimator
        scan = stream.scan(
            job, estimator.z_score_theta == "structured", estimator.z_score_x == "structured",
            keep_val,
        )  # fmt: skip
        self.train_theta, self.train_x = scan.theta_stand_in, scan.x_stand_in  # z-scoring
        self.dim_theta, self.dim_x = manifest["dim_theta"], manifest["dim_x"]
        window = self.cfg.stream_window_rows
        self.info = {
            "simulations": job.num_train + job.num_val,
            "train_samples": job.num_train,
            "val_samples": job.num_val,
            "streamed": f"windows of {window:,} rows",
        }
        train = stream.chunked(job, job.train_rows, window)
        if scan.val is None:
            return train, stream.chunked(job, job.val_rows, window)
        val_theta, val_x = scan.val
        if self._fits(val_theta, val_x, device):
            val_theta, val_x = val_theta.to(device), val_x.to(device)
        return train, TensorData(val_theta, val_x)

    def _fits(self, theta: torch.Tensor, x: torch.Tensor, device: torch.device) -> bool:
        return keep_on_device(self.cfg.data_on_device, theta.nbytes + x.nbytes, device)

    def record(self) -> estimators.BuildRecord:
        return estimators.BuildRecord.from_config(
            self.cfg.estimator, self.dim_theta, self.dim_x, self.cfg.code_dir, self.cfg.method
        )

    def build_model(self) -> nn.Module:
        # z-scoring from the whole training split: the same numbers on every rank
        estimator = estimators.build(self.record(), self.train_theta, self.train_x)
        model = estimators.EstimatorLoss(estimator, self.cfg.method)
        fast_tanh.use_in(model)  # the same function, faster on the CPU (fast_tanh.py)
        self.info["parameters"] = sum(p.numel() for p in model.parameters())
        return model

    def loss(self, model: nn.Module, batch: Batch) -> torch.Tensor:
        theta, x = batch  # the method orders them into the estimator's input and condition
        return model(theta, x).mean()

    def eval_sums(self, model: nn.Module, batch: Batch) -> dict[str, torch.Tensor]:
        theta, x = batch
        losses = model(theta, x).float()
        return {"loss_sum": losses.sum(), "count": torch.tensor(len(losses), device=losses.device)}

    def summarize(self, sums: dict[str, torch.Tensor]) -> dict[str, float]:
        return {"val/loss": sums["loss_sum"].item() / max(sums["count"].item(), 1.0)}

    def finish(
        self, model: nn.Module, run_dir: str | None, folder: Path
    ) -> tuple[dict[str, float], list[Path]]:
        """Rank 0 after training: export the posterior, then evaluate it (C2ST, SBC, plots)
        with the posterior on the training device."""
        import copy

        from trainforge.workloads.sbi import evaluate, export

        assert isinstance(model, estimators.EstimatorLoss)
        # a copy where it trained: the export takes its weights to the CPU, the evaluation
        # samples on this device (no round trip through the CPU)
        estimator = copy.deepcopy(model.estimator).eval()
        spec, sampling = export.prior_spec(self.cfg), export.sampling_of(self.cfg)
        exported = folder / "posterior.pt"
        export.save_posterior(exported, estimator, self.record(), spec, sampling)
        run_folder = storage.local_folder(run_dir)
        if run_folder is not None:
            export.save_posterior(run_folder / "posterior.pt", estimator, self.record(), spec,
                                  sampling)  # fmt: skip
        device = next(model.parameters()).device
        metrics, files = evaluate.run(
            estimator, sources.resolve(self.cfg), self.cfg.evaluation, self.seed, folder, device,
            self.cfg.method, sampling,
        )  # fmt: skip
        return metrics, [exported, *files]

    def mlflow_model(self, model: nn.Module, folder: Path) -> Callable[[], Any]:
        """The posterior as a pyfunc model (``predict``: x → θ samples) — the loss module
        takes (θ, x), which the pytorch flavour's one-input signature cannot describe."""
        import copy
        import functools

        from trainforge.workloads import user_code
        from trainforge.workloads.sbi import export, posterior_model

        assert isinstance(model, estimators.EstimatorLoss)
        estimator = copy.deepcopy(model.estimator).cpu().eval()
        path, record = folder / "posterior.pt", self.record()
        prior = export.prior_spec(self.cfg)
        export.save_posterior(path, estimator, record, prior, export.sampling_of(self.cfg))
        # the user's code that loading the posterior imports, shipped with it
        users = [prior.get("import"), record.embedding, record.model]
        spec = posterior_model.PosteriorExport(
            path, self.train_x[:2].cpu().numpy(), self.dim_theta,
            [p for p in users if p and user_code.is_import_path(p)], self.cfg.code_dir,
        )  # fmt: skip
        # picklable: rank 0 hands it to the command
        return functools.partial(posterior_model.log_pyfunc, spec)

    def describe(self) -> dict[str, Any]:
        return {"task": self._source_name(), "method": self.cfg.method,
                "estimator": methods.model_of(self.cfg), **self.info}  # fmt: skip


def build(cfg: SBIWorkloadConfig, seed: int, precision: PrecisionSection) -> SBIWorkload:
    return SBIWorkload(cfg, seed=seed)  # fp32 only (see the module docstring): no precision


def _row_bytes(manifest: dict[str, Any]) -> int:
    return 4 * (manifest["dim_theta"] + manifest["dim_x"])  # float32 θ and x


def _fits_in_host_memory(nbytes: int) -> bool:
    """Whether loading ``nbytes`` of simulations in every worker on this machine (Ray Train
    sets LOCAL_WORLD_SIZE) leaves the available memory unexhausted."""
    import psutil

    workers = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    return HOST_COPIES * nbytes * workers < psutil.virtual_memory().available
