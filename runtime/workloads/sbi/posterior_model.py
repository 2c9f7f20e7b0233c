"""What rank 0 hands the command to log the trained posterior as an MLflow model: the posterior
file and an input example (``PosteriorExport``), and the function that logs it (``log_pyfunc``).
Here, not in ``pyfunc``, so that a process that only prepares it imports no MLflow: rank 0 hands
``functools.partial(log_pyfunc, spec)`` to the command (``tracking/relay.py``); and so that the
model's code, ``pyfunc`` and what its loading runs, leaves its logging out."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

CODE_FOLDER = "pyfunc-code"


@dataclass
class PosteriorExport:
    """What ``log_pyfunc`` needs: the posterior file, an observation or two as the input
    example, and the user's code the posterior loads (import paths of a custom task's prior,
    an embedding net, a builder) with the folder it was imported from."""

    posterior_file: Path
    example_x: np.ndarray
    dim_theta: int
    user_code: list[str] = field(default_factory=list)
    code_dir: str | None = None


def log_pyfunc(spec: PosteriorExport, model_id: str | None = None, name: str = "posterior") -> Any:
    """The posterior as the pyfunc model (``pyfunc.PosteriorModel``), into the active MLflow run
    or as the logged model ``model_id`` (made beforehand, ``mlflow.initialize_logged_model``);
    returns MLflow's ModelInfo. Its code: the modules of trainforge that its class and its
    loading and sampling import, and the user's modules of ``spec.user_code``
    (``tracking/model_code.py``)."""
    import mlflow.pyfunc
    import pandas as pd
    import sbi
    import torch

    from trainforge.tracking import model_code
    from trainforge.workloads import user_code
    from trainforge.workloads.sbi import pyfunc

    requirements = [
        f"torch=={torch.__version__.split('+')[0]}", f"sbi=={sbi.__version__}",
        f"numpy=={np.__version__}", f"pandas=={pd.__version__}",
    ]  # fmt: skip
    for path in spec.user_code:  # imported here too, where their files are found
        user_code.import_object(path, "the posterior's code", spec.code_dir)
    users = [path.partition(":")[0] for path in spec.user_code]
    folder = spec.posterior_file.parent / CODE_FOLDER
    shutil.rmtree(folder, ignore_errors=True)
    # load_context and predict run the posterior's loading: imports inside functions count
    code = model_code.ship_modules([pyfunc.__name__, *users], folder, inside_functions=True)
    return mlflow.pyfunc.log_model(
        name=name,
        python_model=pyfunc.PosteriorModel(),
        artifacts={"posterior": str(spec.posterior_file)},
        code_paths=[str(path) for path in code],
        signature=pyfunc.signature(spec.dim_theta, spec.example_x.shape[1]),
        input_example=spec.example_x.astype(np.float32),
        pip_requirements=requirements,
        model_id=model_id,
    )
