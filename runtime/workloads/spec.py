"""How a workload family declares itself to the registry (``workloads/__init__.py``): its recipe
schema, its checks, its optional data stage and how to build its ``Workload`` (``base.py``).
No torch here: the driver checks a recipe through the spec, and a family whose checks need no
torch (CNN) is checked without importing it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from trainforge.config.schema import PrecisionSection, Recipe, WorkloadSection
from trainforge.workloads.stage import StageRunner

if TYPE_CHECKING:
    from trainforge.workloads.base import Workload


W = TypeVar("W", bound=WorkloadSection)


def _no_check(cfg: WorkloadSection, recipe: Recipe) -> None:
    return None


def _no_data_check(cfg: WorkloadSection) -> None:
    return None


def _unknown_size(cfg: WorkloadSection) -> int | None:
    return None


def _needs_no_cluster(cfg: WorkloadSection) -> bool:
    return False


@dataclass(frozen=True)
class Ensembles(Generic[W]):
    """How runs of a family combine into one model (SBI: posteriors into their equal-weight
    mixture), for a recipe that asks for several members (``driver/ensemble_run.py``) and for
    `trainforge ensemble`."""

    members: Callable[[W], int]
    """How many members the section asks for (1: none, a run of its own)."""
    output: str
    """The file a member's run folder holds once it finished, which ``combine`` reads."""
    combine: Callable[[list[Path], Path], dict[str, Any]]
    """(members: run folders or output files, out) → what the combined file holds, for lines:
    ``members``, ``prior``, ``models``. Raises RecipeError for members that do not fit."""
    evaluate: Callable[[Path, W, int, Path], tuple[dict[str, float], list[Path]]]
    """(combined file, section, seed, folder) → the recipe's evaluation of it, on this machine's
    CPU, and the figures written under the folder."""


@dataclass(frozen=True)
class Rounds(Generic[W]):
    """How runs of a family follow one another in sequential rounds (SBI: each round simulates
    θ drawn from what the round before learned), for a recipe that asks for more than one
    (``driver/rounds_run.py``)."""

    count: Callable[[W], int]
    """How many rounds the section asks for (1: none, a run of its own)."""
    output: str
    """The file a round's run folder holds once it finished; the last round's becomes the
    command's run's."""
    for_stage: Callable[[W, Path | None], W]
    """(section, proposal file or None for the first round) → the section whose data stage
    makes the round's data."""
    propose: Callable[[W, Path, int, Path], str]
    """(section, the previous round's run folder, seed, file) → the next round's proposal
    written to the file; a line saying what it drew."""
    training_data: Callable[[list[W], Path], list[str]]
    """(the rounds' sections so far, their data made, a folder) → the overrides that train a
    round's run on all of their data (combined under the folder)."""
    overrides: tuple[str, ...] = ()
    """What every round's run is given besides the command's recipe and overrides."""


@dataclass(frozen=True)
class WorkloadSpec(Generic[W]):
    """A workload family as the registry sees it. Functions import their heavy modules when
    called, so validating a recipe of one family never imports another's libraries."""

    kind: str
    """The ``workload.kind`` that selects this family."""
    schema: type[W]
    """The ``workload`` section's dataclass (a WorkloadSection); checks its own values."""
    build: Callable[[W, int, PrecisionSection], Workload]
    """(section, seed, precision) → the Workload, in each training worker."""
    check: Callable[[W, Recipe], None] = _no_check
    """Recipe checks beyond the section's own: names in the family's registries (models,
    tasks), rules against other sections. Raises RecipeError; never changes anything."""
    check_data: Callable[[W], None] = _no_data_check
    """Is the data where the recipe says, on this machine? The driver's check before Ray."""
    train_samples: Callable[[W], int | None] = _unknown_size
    """Rows of the training split as the recipe (or its finished data) says, without loading
    anything; None when only reading the data would tell. Lets the driver refuse a batch larger
    than a worker's shard before any worker starts."""
    start_data: Callable[[W, int, str, StageRunner], None] | None = None
    """(section, seed, storage root, runner): begin the data stage before the cluster is
    reached, where it needs none (SBI: small simulations of a built-in task, made by a process
    of the command's own while Ray starts); ``prepare_data`` waits for it. None: nothing to
    begin."""
    prepare_data: Callable[[W, int, str, StageRunner | None], W] | None = None
    """(section, seed, storage root, runner) → the section with its data made and located, run
    by ``config.resolve`` on the connected cluster (SBI: the simulation stage), its work handed
    to the driver's ``runner`` (``workloads/stage.py``; None where the driver runs no stage: the
    data must be there). None: no stage."""
    needs_cluster: Callable[[W], bool] = _needs_no_cluster
    """Whether the data stage spreads its work over a Ray cluster (SBI: simulations too big for
    the command's own process): such a command joins or starts one, and its workers run there,
    not as processes of its own."""
    worker_imports: tuple[str, ...] = ()
    """What a worker imports for its first step beyond torch and the loop (the model's library,
    what its first forward pass imports): a cold command's own workers import it at their start,
    while the command makes the data, instead of after it."""
    model_imports: tuple[str, ...] = ("torch", "mlflow.pytorch")
    """What logging the final model imports: the command imports it while the workers train
    where it logs the model that rank 0 hands it (``tracking/relay.py``)."""
    trained: Callable[[W, Path], Any] | None = None
    """(section, run folder) → what ``trainforge.load`` gives back of a finished run when that
    is not the model with its final weights (SBI: sbi's posterior, from the run's
    ``posterior.pt``). None: the model."""
    ensembles: Ensembles[W] | None = None
    """How runs of the family combine (None: they do not)."""
    rounds: Rounds[W] | None = None
    """How runs of the family follow one another in sequential rounds (None: they do not)."""
    rehearsal: dict[str, Any] = field(default_factory=dict)
    """Values of the ``workload`` section for a rehearsal (``driver/rehearsal.py``: new warm
    workers' first run, a few steps in the background): what keeps its final evaluation short.
    Empty: the section as the command ran it."""
