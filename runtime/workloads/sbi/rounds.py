"""Sequential rounds (``workload.rounds``), the family's part: the θ a later round simulates,
drawn from what the round before learned at the observation, and the simulations of every round
so far as one folder to train on. The driver runs the rounds (``driver/rounds_run.py``): each
round's simulation stage, then its training, a run of its own.

A round after the first draws its θ by the method's rule (``Method.proposes``): NPE from the
prior truncated to the previous posterior's highest-density region (sbi's TSNPE: the region
holding all but ``TRUNCATION_QUANTILE`` of its mass, estimated from
``SUPPORT_SAMPLES`` posterior samples; prior samples outside it are rejected), so that NPE's
loss needs no correction; NLE and NRE from the previous posterior itself (sbi's SNLE, SNRE;
their losses take θ from any proposal, and their posteriors multiply by the prior anyway).

The truncation judges prior draws by the flow's density until enough fall inside: where the
region is a small part of the prior (slcp's: under 1%), tens of millions of draws, ~3 s of one
CPU core per 10^5 for a spline flow. So it runs on the GPU where the command's machine has one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from pathlib import Path
from typing import Any

from trainforge.atomic import replacing
from trainforge.errors import RecipeError
from trainforge.workloads.sbi import chunking, methods
from trainforge.workloads.sbi.config import SBIWorkloadConfig
from trainforge.workloads.sbi.simulations import (
    MANIFEST,
    chunk_file,
    read_chunk,
    read_manifest,
    save_chunk,
    summarize,
    write_json,
)

TRUNCATION_QUANTILE = 1e-4  # sbi's default for TSNPE (get_density_thresholder)
SUPPORT_SAMPLES = 100_000  # posterior samples that place the threshold (sbi's default 10^6:
# ~10 of them fall below it here, enough for a 10^-4 quantile and 10× quicker on a CPU)
REJECTION_BATCH = 100_000  # prior draws judged at once (sbi's default 10,000)
POSTERIOR_FILE = "posterior.pt"
FORMAT = 1


def for_stage(cfg: SBIWorkloadConfig, proposal: Path | None) -> SBIWorkloadConfig:
    """The section whose simulation stage makes a round's simulations (a section of one
    round): θ from the proposal file (None: the first round's, from the prior)."""
    simulation = dataclasses.replace(cfg.simulation, proposal=str(proposal) if proposal else None)
    evaluation = dataclasses.replace(cfg.evaluation, observed=None)  # the rounds' own
    return dataclasses.replace(cfg, simulation=simulation, evaluation=evaluation, rounds=1)


def observed_x(path: str, dim_x: int) -> Any:
    """A custom task's observed x (``workload.evaluation.observed``: a tensor in a .pt file or
    an array in a .npy file, of any shape holding the simulator's ``dim_x`` values) as one row
    [1, dim_x] of float32; one line naming what is wrong with it otherwise."""
    import numpy as np
    import torch

    key, file = "workload.evaluation.observed", Path(path)
    if not file.is_file():
        raise RecipeError(f"{key}: {file} does not exist")
    try:
        if file.suffix == ".npy":
            value = torch.from_numpy(np.load(file, allow_pickle=False))
        else:
            value = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as exc:  # any unreadable file: named, with the reader's own words
        raise RecipeError(f"{key}: {file} could not be read: {exc}") from None
    if not isinstance(value, torch.Tensor):
        raise RecipeError(f"{key}: {file} holds a {type(value).__name__}, not one tensor")
    if value.numel() != dim_x:
        raise RecipeError(f"{key}: {file} holds {value.numel()} values of shape "
                          f"{tuple(value.shape)}; the simulator's x has {dim_x}")  # fmt: skip
    x = value.reshape(1, dim_x).float()
    if not bool(torch.isfinite(x).all()):
        raise RecipeError(f"{key}: {file} holds NaN or infinite values")
    return x


def _observation(cfg: SBIWorkloadConfig) -> tuple[Any, str]:
    """The x the rounds focus on, and how to name it: a built-in task's observation, or a
    custom task's observed x."""
    from trainforge.workloads.sbi import sources
    from trainforge.workloads.sbi.observations import Observations

    source = sources.resolve(cfg)
    if source.task is None:  # a custom task
        observed = str(cfg.evaluation.observed)
        return observed_x(observed, source.dim_x), f"the observed x in {observed}"
    number = cfg.evaluation.observations[0]
    x_o = Observations.of(source.task, cfg.evaluation).observation(number)[1]
    return x_o, f"observation {number}"


def propose(cfg: SBIWorkloadConfig, previous: Path, seed: int, out: Path) -> str:
    """``num_simulations`` θ for the next round, from the posterior in the round run folder
    ``previous`` at the recipe's observation, written to ``out`` (whole or not at all); a line
    saying how they were drawn."""
    import numpy as np
    import torch
    from sbi.utils import RestrictedPrior, get_density_thresholder

    from trainforge.workloads.sbi.export import load_posterior

    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)  # sbi's slice samplers draw from numpy's global RNG
    x_o, at = _observation(cfg)
    truncates = methods.get(cfg.method).proposes == "truncated_prior"
    device = "cuda" if truncates and torch.cuda.is_available() else "cpu"
    posterior = load_posterior(previous / POSTERIOR_FILE, device)
    posterior.set_default_x(x_o.to(device))
    n = cfg.simulation.num_simulations
    if truncates:
        inside = get_density_thresholder(_Quiet(posterior), TRUNCATION_QUANTILE, SUPPORT_SAMPLES)
        truncated = RestrictedPrior(posterior.prior, inside, sample_with="rejection",
                                    device=device)  # fmt: skip
        theta = truncated.sample((n,), max_sampling_batch_size=REJECTION_BATCH,
                                 save_acceptance_rate=True, print_rejected_frac=False)  # fmt: skip
        where = "on the GPU" if device == "cuda" else "on the CPU"
        how = (f"the prior truncated to round {previous.name}'s posterior at {at} (it keeps "
               f"{truncated.acceptance_rate:.1%} of the prior; judged {where})")  # fmt: skip
    else:
        theta = posterior.sample((n,), show_progress_bars=False)
        how = f"round {previous.name}'s posterior at {at} (MCMC)"
    out.parent.mkdir(parents=True, exist_ok=True)
    with replacing(out) as temporary:
        torch.save(theta.float().cpu().contiguous(), temporary)
    return f"{n:,} θ from {how}"


class _Quiet:
    """A posterior whose samples draw no progress bar (sbi's thresholder asks for them
    without saying)."""

    def __init__(self, posterior: Any) -> None:
        self.posterior = posterior

    def sample(self, shape: tuple[int, ...]) -> Any:
        return self.posterior.sample(shape, show_progress_bars=False)

    def log_prob(self, theta: Any) -> Any:
        return self.posterior.log_prob(theta)


def training_data(folders: list[Path], out: Path) -> Path:
    """The simulations of ``folders`` (finished cache entries, one per round so far) as one
    entry at ``out``: their chunks in order, cut again at the first entry's chunk size; its
    manifest last. Kept where it is already whole (a resumed command)."""
    if (out / MANIFEST).is_file():
        return out
    import torch

    manifests = [read_manifest(folder) for folder in folders]
    pairs = [read_chunk(chunk_file(folder, i))
             for folder, m in zip(folders, manifests, strict=True)
             for i in range(m["chunks"])]  # fmt: skip
    theta = torch.cat([t for t, _ in pairs])
    x = torch.cat([x for _, x in pairs])
    rows = int(manifests[0]["chunk_size"])
    sizes = chunking.chunk_sizes(len(x), rows)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for index, (t, xs) in enumerate(zip(theta.split(sizes), x.split(sizes), strict=True)):
        invalid = int((~torch.isfinite(xs).all(dim=1)).sum())
        chunk = {"theta": t.clone(), "x": xs.clone(), "invalid": invalid, "failed": 0,
                 "first_failure": ""}  # fmt: skip
        save_chunk(chunk, chunk_file(out, index))
        paths.append(chunk_file(out, index))
    spec = {"format": FORMAT, "rounds": [m.get("key", "") for m in manifests],
            "num_simulations": len(x), "chunk_size": rows}  # fmt: skip
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]
    write_json(out / "spec.json", spec)
    write_json(out / MANIFEST, summarize(spec, key, paths))
    return out


def data_path(cfg: Any) -> Path:
    """Where a prepared section's simulations are."""
    assert cfg.simulation.path is not None, "a section whose simulation stage has run"
    return Path(cfg.simulation.path)
