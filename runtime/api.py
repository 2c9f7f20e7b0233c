"""The Python API, for notebooks and scripts: ``trainforge.train`` runs a recipe the way
`trainforge train` does (the same checks, worker groups, checkpoints and MLflow records) and
returns what the command prints at its end; ``trainforge.load`` gives a finished run's model
(an SBI run's posterior) back. A refusal is the command's one-line message as a
``RecipeError``; a run that fails is a ``RunFailed``."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainforge.errors import RecipeError

if TYPE_CHECKING:
    from trainforge.config.schema import Recipe

RecipeSource = str | Path | Mapping[str, Any]
"""A recipe file, a shipped recipe's name (`trainforge recipes`), or the recipe itself."""
Overrides = Sequence[str] | Mapping[str, Any]
"""``["train.lr=0.01"]`` as on the command line, or ``{"train.lr": 0.01}``."""


class RunFailed(RuntimeError):
    """The run started and did not finish (a worker's error past ``run.max_failures``, a NaN
    loss, a stop); what it trained is kept, and training it again resumes it."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class Result:
    """A finished run, as the command's closing table shows it."""

    metrics: dict[str, Any]
    """The final metrics (val/loss, val/accuracy, c2st/mean …)."""
    checkpoint: str | None
    """The final checkpoint's folder (None where the run keeps none on this machine)."""
    run_id: str | None
    """The MLflow run (None with tracking off)."""
    tracking_uri: str | None
    recipe: Recipe | None = field(repr=False, default=None)
    """The recipe as trained: worker count, device and data paths decided."""

    def load(self) -> Any:
        """The trained model (an SBI run's posterior): ``trainforge.load`` of this run."""
        if self.checkpoint is None:
            raise RecipeError("this run kept no checkpoint on this machine: nothing to load")
        return load(Path(self.checkpoint).parent)


def train(recipe: RecipeSource, overrides: Overrides = ()) -> Result:
    """Train ``recipe`` (with ``overrides``) to the end, as `trainforge train` does; a run of
    the same ``run.name`` resumes. Raises RecipeError before any worker starts for a recipe or
    a machine that cannot run it, RunFailed for a run that did not finish."""
    from trainforge import log
    from trainforge.cli import check_optional_modules, set_loudness
    from trainforge.driver import launch

    log.STARTED_AT = time.time()  # the run's start (its MLflow start time, "finished in")
    set_loudness(log.verbosity())  # the command's console: trainforge's lines, not MLflow's INFO
    cfg = _recipe(recipe, _as_list(overrides))
    check_optional_modules(cfg.workload.kind)
    from trainforge.workloads import spec_for

    spec = spec_for(cfg.workload.kind)
    if spec.ensembles is not None and spec.ensembles.members(cfg.workload) > 1:
        raise RecipeError("workload.ensemble: an ensemble trains through `trainforge train`; "
                          "trainforge.train takes one run")  # fmt: skip
    if spec.rounds is not None and spec.rounds.count(cfg.workload) > 1:
        raise RecipeError("workload.rounds: sequential rounds train through `trainforge "
                          "train`; trainforge.train takes one run")  # fmt: skip
    outcome = launch.train(cfg)
    if outcome.exit_code != 0:
        raise RunFailed(
            f"run {cfg.run.name!r} did not finish (exit status {outcome.exit_code}: its lines "
            "above say why); its checkpoints are kept, and training it again resumes it",
            outcome.exit_code,
        )
    return Result(outcome.metrics, outcome.checkpoint_path, outcome.mlflow_run_id,
                  outcome.tracking_uri, outcome.recipe)  # fmt: skip


def load(run: str | Path) -> Any:
    """A finished run's model with its final weights, on the CPU and in eval mode (an SBI
    run's posterior: sbi's posterior object of its method, e.g. a ``DirectPosterior`` for NPE,
    an ``MCMCPosterior`` for NLE and NRE; an ensemble's mixture; sequential rounds' last
    posterior). ``run``: the run's folder (``runs/NAME``) or one of its checkpoint folders.
    The model is built by the run's own recipe (kept in every checkpoint) and its weights load
    with ``weights_only=True``."""
    from trainforge import checkpoint, config
    from trainforge.workloads import build_workload, spec_for

    folder = Path(run)
    if (folder / checkpoint.STATE_FILE).is_file():  # a checkpoint folder
        state, run_dir, recipe_dir = checkpoint.load(folder), folder.parent, folder
    else:
        newest = checkpoint.newest_verified(folder) if folder.is_dir() else None
        if newest is None:
            composed = _composed(folder)
            if composed is not None:
                return composed
            raise RecipeError(f"{folder}: no run folder with a valid checkpoint (give runs/NAME)")
        state, run_dir, recipe_dir = checkpoint.load(newest), folder, newest
    cfg = config.load(recipe_dir / checkpoint.RECIPE_FILE)
    trained = spec_for(cfg.workload.kind).trained
    if trained is not None:
        return trained(cfg.workload, run_dir)
    model = build_workload(cfg.workload, cfg.run.seed, cfg.precision).build_model()
    model.load_state_dict(state["model"])
    return model.eval()


def _composed(folder: Path) -> Any | None:
    """What a command that ran other runs left (an SBI ensemble's mixture, sequential rounds'
    last posterior): its folder holds the recipe and the family's output, no checkpoint of its
    own. None where it holds neither."""
    from trainforge import config
    from trainforge.driver.child_runs import RECIPE_FILE
    from trainforge.workloads import spec_for

    if not (folder / RECIPE_FILE).is_file():
        return None
    cfg = config.load(folder / RECIPE_FILE)
    trained = spec_for(cfg.workload.kind).trained
    try:
        return trained(cfg.workload, folder) if trained is not None else None
    except FileNotFoundError:  # not finished yet
        return None


def _recipe(recipe: RecipeSource, overrides: list[str]) -> Recipe:
    from trainforge import config, resources

    if isinstance(recipe, Mapping):
        return config.from_mapping(recipe, overrides)
    path, _ = resources.find_recipe(str(recipe))
    return config.load(path, overrides)


def _as_list(overrides: Overrides) -> list[str]:
    """Overrides as the command line gives them: a mapping's values written as YAML reads them
    (JSON is YAML), so that ``{"run.name": "a b"}`` stays text and ``[1, 2]`` a list."""
    if isinstance(overrides, str):
        raise TypeError("overrides: a list of 'key=value' strings or a mapping, not one string")
    if isinstance(overrides, Mapping):
        return [f"{key}={json.dumps(value)}" for key, value in overrides.items()]
    return list(overrides)
