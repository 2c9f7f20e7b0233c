"""The run's final model as an MLflow model: the pytorch flavour (loadable with
``mlflow.pytorch.load_model``, with its input example, explicit requirements and only the code
its classes need, trainforge's and the user's) or the workload's own (e.g. SBI's posterior
pyfunc), named after the workload and linked to the run's evaluation metrics (MLflow 3's
``model_id``). Logged by rank 0, or by the command where it sends rank 0's records
(``tracking/relay.py``): rank 0 then hands it the module.

Hand-written beside MLflow's documented arguments (``pip_requirements``, ``code_paths``, which it
uses): ``no_package_scan``, because with every one of them MLflow scans every installed package
first, 1.9 → 0.8 CPU-s of a cold run's end on this project's CPU (``bench/model_logging.py``)."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import importlib
import logging
import os
import pickle
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

from trainforge.log import verbosity, warn
from trainforge.tracking import model_code
from trainforge.tracking.client import RunHandle


def for_mlflow(model: Any, example: Any) -> tuple[Any, Any]:
    """A float32 CPU copy of ``model`` in eval mode, and its input example as a numpy array:
    what the pytorch flavour logs (and what rank 0 hands the command)."""
    cpu_model = copy.deepcopy(model).float().cpu().eval()
    return cpu_model, example.detach().float().cpu().numpy()


MetricRow = tuple[str, float, int, int]  # key, value, timestamp ms, step: as the run logged it
NOT_EVALUATION = ("train/", "perf/", "system/", "sys/", "run/", "worker/")
SOURCE_TAGS = ("mlflow.source.name", "mlflow.source.type", "mlflow.source.git.commit",
               "mlflow.user")  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ModelRecord:
    """What the logged model is called (after the workload: ``resnet18_cifar``,
    ``posterior``), and the run's evaluation metrics it is linked to, as the run logged them."""

    name: str = "model"
    metrics: tuple[MetricRow, ...] = ()

    @classmethod
    def of(cls, name: str, latest: dict[str, MetricRow]) -> ModelRecord:
        """The record of a model named ``name``, from the run's latest row of each metric:
        its evaluation's (``val/…``, ``final/…``, a workload's own such as ``c2st/…``), not
        training's, performance's, the system's or the run's own (``run/restarts``)."""
        kept = (
            row for key, row in latest.items() if "/" in key and not key.startswith(NOT_EVALUATION)
        )
        return cls(name, tuple(sorted(kept)))

    @property
    def step(self) -> int:
        """The step the model is the run's output at: its evaluation's."""
        return max((row[3] for row in self.metrics), default=0)


def handed_over(
    model: Any, example: Any, custom: Callable[..., Any] | None, record: ModelRecord | None = None
) -> bytes:
    """What ``log`` would be given, as rank 0 hands it to the command (``log_handed``):
    pickled here, so that the connection to the command sends bytes. Its own pickler would
    send the tensors' memory as file descriptors, which the command can only take from a
    process that multiprocessing started (it refused them: "digest sent was rejected")."""
    return pickle.dumps((model, example, custom, record or ModelRecord()))


def log_handed(handle: RunHandle, handed: bytes) -> bool:
    """The model rank 0 handed over (``handed_over``), logged; False where it could not be
    (said)."""
    try:
        model, example, custom, record = pickle.loads(handed)
    except Exception as exc:
        _failed(exc)
        return False
    with _quiet():
        return log(handle, model, example, custom, record)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """MLflow's warnings while it logs the model, kept off the command's console unless -v, as
    they were when rank 0 logged it (its lines go to the run's worker-output.log): that a
    pickled model needs trust to load (our choice, see ``_log_pytorch_model``)."""
    mlflow_logger = logging.getLogger("mlflow")
    level = mlflow_logger.level
    if verbosity() <= 0:
        mlflow_logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        mlflow_logger.setLevel(level)


def log(
    handle: RunHandle,
    model: Any = None,
    example: Any = None,
    custom: Callable[..., Any] | None = None,
    record: ModelRecord | None = None,
) -> bool:
    """``model`` with its input ``example`` (as ``for_mlflow`` makes them) as the pytorch
    flavour, or the model as ``custom`` logs it (given MLflow's ``model_id`` to log it as),
    named and linked as ``record`` says (``initialized``), the run's output. A failure is said,
    not raised (the state dict is logged already): False."""
    record = record or ModelRecord()
    try:
        with no_package_scan(), refused(IPYTHON), _environment_kept():
            import mlflow
            from mlflow.entities import LoggedModelOutput

            mlflow.set_tracking_uri(handle.tracking_uri)
            model_id = initialized(handle, record)
            if custom is not None:
                custom(model_id=model_id)
            else:
                _log_pytorch_model(model_id, model, example)
            output = LoggedModelOutput(model_id, step=record.step)
            mlflow.MlflowClient().log_outputs(str(handle.run_id), models=[output])
    except Exception as exc:
        _failed(exc)
        return False
    return True


@contextlib.contextmanager
def _environment_kept() -> Iterator[None]:
    """``mlflow.set_tracking_uri`` also sets $MLFLOW_TRACKING_URI, for MLflow's subprocesses;
    left there it outlived the logging: in the command, the lasting cluster it starts
    afterwards inherited it, and a later command's warm workers, asked for the default store
    of that command's folder, recorded into the first command's store instead. MLflow's own
    global URI is cleared too: kept, it outranked the variable for every later use of MLflow's
    fluent API in the process (a test's store after another's in one pytest worker)."""
    saved = os.environ.get("MLFLOW_TRACKING_URI")
    try:
        yield
    finally:
        if "mlflow" in sys.modules:  # clears $MLFLOW_TRACKING_URI as well, restored just below
            sys.modules["mlflow"].set_tracking_uri(None)
        if saved is None:
            os.environ.pop("MLFLOW_TRACKING_URI", None)
        else:
            os.environ["MLFLOW_TRACKING_URI"] = saved


def _failed(exc: Exception) -> None:
    warn(f"logging the MLflow model failed ({exc}); the state dict is logged")


@contextlib.contextmanager
def no_package_scan() -> Iterator[None]:
    """MLflow's model logging without its scan of every installed package. Our models name
    their requirements (``torch==…``, ``numpy==…``), and MLflow checks each against the
    installed version. For that check it first maps every installed distribution's files to
    their modules (``importlib_metadata.packages_distributions``), to find a package's module
    should its version not be found by its name: 0.8-1.6 s of this project's CPU at every cold
    run's end, more where imports are slower. Our requirements' versions are found by name, so
    an empty map gives the same check. The map is a private global of MLflow 3.17
    (``requirements_utils._MODULES_TO_PACKAGES``); it is put back as it was, so anything else
    in the process that infers requirements still builds the full map."""
    from mlflow.utils import requirements_utils

    if getattr(requirements_utils, "_MODULES_TO_PACKAGES", ()) is not None:
        yield  # built already, or a MLflow without it: nothing to save
        return
    # MLflow declares the global as None only: mypy takes that for its type
    requirements_utils._MODULES_TO_PACKAGES = {}  # type: ignore[assignment]
    try:
        yield
    finally:
        requirements_utils._MODULES_TO_PACKAGES = None


LIGHTNING = ("pytorch_lightning", "lightning")
IPYTHON = ("IPython",)
"""While a model is logged: MLflow asks whether it runs in a notebook (the logged model's tags,
``jupyter_notebook_context``; Databricks' ``dbutils``) by importing IPython and calling
``get_ipython()``: 0.15 s of this project's CPU wherever IPython is installed (after MLflow and
torch), on the command's way to the run's end. A process that has not imported IPython is no
notebook, and the answer without it (ImportError: not in one) is the same."""


@contextlib.contextmanager
def refused(names: tuple[str, ...]) -> Iterator[None]:
    """Imports of ``names`` fail (ImportError, which MLflow catches where it tries them) inside
    the block, unless something imported them before; allowed again after it. A ``None`` entry
    in ``sys.modules`` is Python's way to make ``import`` raise."""
    missing = [name for name in names if name not in sys.modules]
    for name in missing:
        sys.modules[name] = None  # type: ignore[assignment]
    try:
        yield
    finally:
        for name in missing:
            if name in sys.modules and sys.modules[name] is None:
                del sys.modules[name]


def import_for_logging(name: str) -> ModuleType:
    """A module the model's logging needs, imported ahead (``tracking/relay.py``); MLflow's
    pytorch flavour without Lightning (``pytorch_flavour``)."""
    return pytorch_flavour() if name == "mlflow.pytorch" else importlib.import_module(name)


def pytorch_flavour() -> ModuleType:
    """``mlflow.pytorch``, imported without PyTorch Lightning. At its import MLflow 3.17's
    pytorch flavour imports ``pytorch_lightning`` wherever it is installed, for a checkpoint
    callback of its Lightning autologging, which trainforge does not use. On GPU hosts that have
    Lightning the flavour's import took 11-13 s, 4.6-5.1 s without it, much of it on the
    command's way to the run's end. So, unless something imported
    Lightning before, its names are refused while the flavour is imported (a ``None`` entry in
    ``sys.modules`` makes ``import`` raise ImportError, which MLflow catches), then allowed
    again."""
    with refused(LIGHTNING):
        return importlib.import_module("mlflow.pytorch")


def _log_pytorch_model(model_id: str, cpu_model: Any, example: Any) -> None:
    import numpy as np
    import torch

    requirements = [f"torch=={torch.__version__.split('+')[0]}", f"numpy=={np.__version__}"]
    with tempfile.TemporaryDirectory() as folder:
        # the code its classes need (trainforge's, the user's), so that it loads where
        # neither trainforge nor the user's project is on the path
        code = model_code.ship(cpu_model, Path(folder))
        pytorch_flavour().log_model(
            cpu_model,
            model_id=model_id,
            input_example=example,
            pip_requirements=requirements,
            code_paths=[str(path) for path in code] or None,
            # MLflow 3.17's default, "pt2", runs torch.export at every run's end: importing
            # torch._dynamo and tracing took 8-18 s for ResNet-18 on this project's 2-core CPU
            # against 2 s pickled, and the user waits for it. The pickle loads anywhere the
            # package shipped beside it does (code_paths), for any module torch.export may refuse.
            serialization_format="pickle",
        )


def initialized(handle: RunHandle, record: ModelRecord) -> str:
    """The id of a new logged model of the run, for a flavour's ``log_model`` to fill: named
    ``record.name``, with the run's params and source (the command and recipe, not the process
    that logs it: Ray's ``default_worker.py`` on warm workers), and linked to the run's
    evaluation metrics, the rows the run logs (the same timestamps and steps: its history gains
    no second value). Made first, not by ``log_model`` in the run: that links whichever of the
    run's metrics have the model's step, the system metrics' sample of that number among them."""
    import mlflow
    from mlflow.entities import Metric

    client = mlflow.MlflowClient()
    run = client.get_run(str(handle.run_id))
    source = {key: run.data.tags[key] for key in SOURCE_TAGS if key in run.data.tags}
    model_id = mlflow.initialize_logged_model(
        name=record.name, source_run_id=run.info.run_id, tags=source, params=run.data.params,
        experiment_id=run.info.experiment_id,
    ).model_id  # fmt: skip
    if record.metrics:
        metrics = [Metric(*row, model_id=model_id) for row in record.metrics]
        client.log_batch(run.info.run_id, metrics=metrics)
    return str(model_id)
