"""What rank 0 hands the command to log the trained posterior as an MLflow model: the posterior
file and an input example (``PosteriorExport``), and the function that logs it (``log_pyfunc``).
Here, not in ``pyfunc``, so that a process that only prepares it imports no MLflow: rank 0 hands
``functools.partial(log_pyfunc, spec)`` to the command (``tracking/relay.py``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class PosteriorExport:
    """What ``pyfunc.log`` needs: the posterior file, an observation or two as the input
    example, and the user's modules a custom task's prior lives in."""

    posterior_file: Path
    example_x: np.ndarray
    dim_theta: int
    user_modules: list[str] = field(default_factory=list)


def log_pyfunc(spec: PosteriorExport, model_id: str | None = None) -> Any:
    """The posterior as the pyfunc model, into the active MLflow run or as the logged model
    ``model_id`` (``pyfunc.log``)."""
    from trainforge.workloads.sbi import pyfunc

    return pyfunc.log(spec, model_id=model_id)
