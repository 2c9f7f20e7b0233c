"""Which observations an SBI evaluation uses, and the reference samples that score it there.

``workload.evaluation.observations_from``:
- ``sbibm`` (the default): the sbibm benchmark's ten stored observations per task, scored
  against its stored reference posterior samples, so that C2ST values compare with sbibm's
  published tables. Read from the sbibm 1.1.0 wheel (``sbibm_data``), which the driver locates
  or fetches before any worker starts and names in the resolved recipe (``sbibm_path``).
- ``own``: this project's seeded observations (``Task.observation``) and its own reference
  samplers (``reference``): no download, and the only choice for tasks sbibm does not have.

Which one a run used is in its resolved recipe (an MLflow param), in the evaluation's console
lines and in its ``evaluation/observations.json`` artifact (with the x and θ it used).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainforge.errors import RecipeError
from trainforge.workloads.sbi import sbibm_data
from trainforge.workloads.sbi.catalogue import CUSTOM
from trainforge.workloads.sbi.config import EvaluationSection, SBIWorkloadConfig

if TYPE_CHECKING:  # torch only in the workers' evaluation (the driver's checks go without it)
    from torch import Tensor

    from trainforge.workloads.sbi.tasks.base import Task


def uses_sbibm(cfg: SBIWorkloadConfig) -> bool:
    """Whether the evaluation reads sbibm's files (a built-in task, observations to score)."""
    evaluation = cfg.evaluation
    if cfg.task == CUSTOM or not evaluation.observations or evaluation.observations_from != "sbibm":
        return False
    if cfg.task not in sbibm_data.TASK_NAMES:
        raise RecipeError(
            f"workload.evaluation.observations_from: sbibm stores no observations of task "
            f"{cfg.task!r} (it has {', '.join(sbibm_data.TASK_NAMES)}); use own"
        )
    return True


def check(cfg: SBIWorkloadConfig) -> None:
    """The driver's check before Ray, without the network: a wheel or folder named by the
    recipe or ``$TRAINFORGE_SBIBM`` must be sbibm's (the cache is filled later, by
    ``prepare``, when nothing is named)."""
    if uses_sbibm(cfg) and (cfg.evaluation.sbibm_path or sbibm_data.given_path()):
        sbibm_data.locate(cfg.evaluation.sbibm_path)


def prepare(cfg: SBIWorkloadConfig) -> SBIWorkloadConfig:
    """``cfg`` with ``evaluation.sbibm_path`` set to where sbibm's files are on this machine
    (fetched into the cache if needed), before the simulation stage: an offline machine fails
    here, in one line, not after training."""
    if not uses_sbibm(cfg):
        return cfg
    data = sbibm_data.open_data(cfg.evaluation.sbibm_path)
    if cfg.task == "bernoulli_glm":
        _check_design(data)
    evaluation = dataclasses.replace(cfg.evaluation, sbibm_path=str(data.location))
    return dataclasses.replace(cfg, evaluation=evaluation)


def _check_design(data: sbibm_data.SbibmData) -> None:
    import torch

    from trainforge.workloads.sbi.tasks.bernoulli_glm import design_matrix

    if not torch.equal(data.design_matrix().double(), design_matrix()):
        raise sbibm_data.SbibmDataError(
            f"{data.location}: bernoulli_glm's design matrix is not sbibm "
            f"{sbibm_data.VERSION}'s (another sbibm version?); its observations would not fit "
            "this simulator"
        )


@dataclass(frozen=True)
class Observations:
    """A task's numbered observations and reference samples, from sbibm's files or our own."""

    task: Task
    data: sbibm_data.SbibmData | None  # None: this project's own

    @classmethod
    def of(cls, task: Task, cfg: EvaluationSection) -> Observations:
        if cfg.observations_from == "own":
            return cls(task, None)
        # The driver's path, when this worker's machine has it (another node may not: then
        # this machine's own copy, from $TRAINFORGE_SBIBM, the cache or PyPI).
        given = cfg.sbibm_path if cfg.sbibm_path and Path(cfg.sbibm_path).exists() else None
        return cls(task, sbibm_data.open_data(given))

    @property
    def label(self) -> str:
        return f"sbibm {sbibm_data.VERSION}" if self.data is not None else "own"

    def observation(self, number: int) -> tuple[Tensor, Tensor]:
        """(θ_true ``[dim_theta]``, x_obs ``[dim_x]``), float32 on CPU."""
        if self.data is None:
            return self.task.observation(number)
        name = self.task.name
        return self.data.true_parameters(name, number), self.data.observation(name, number)

    def reference(self, number: int, n: int, seed: int) -> Tensor:
        """Reference posterior samples at observation ``number``: ``n`` of them, or all of
        sbibm's 10,000 when fewer are stored than asked for."""
        from trainforge.workloads.sbi.reference import reference_samples

        if self.data is None:
            return reference_samples(self.task, number, n, seed=seed)
        stored = self.data.reference_samples(self.task.name, number)
        if n >= len(stored):
            return stored
        # a random subset: slcp's and bernoulli_glm's are stored in MCMC chain order
        import torch

        pick = torch.randperm(len(stored), generator=torch.Generator().manual_seed(seed))
        return stored[pick[:n]]

    def describe(self, numbers: list[int]) -> dict[str, Any]:
        """What ``observations.json`` records: the source and the values used."""
        record: dict[str, Any] = {"observations_from": "sbibm" if self.data else "own"}
        if self.data is not None:
            record |= {"sbibm_version": sbibm_data.VERSION, "location": str(self.data.location)}
        record["observations"] = {}
        for number in numbers:
            theta, x = self.observation(number)
            record["observations"][str(number)] = {"x": x.tolist(), "theta_true": theta.tolist()}
        return record

    def write(self, numbers: list[int], path: Path) -> Path:
        path.write_text(json.dumps(self.describe(numbers), indent=2) + "\n")
        return path
