"""The trained posterior as an MLflow model (``pyfunc`` flavour), so it can be registered,
loaded with ``mlflow.pyfunc.load_model`` and served: ``predict`` takes observations x (one per
row) and returns posterior samples θ ~ q(θ | x).

    model = mlflow.pyfunc.load_model("models:/two_moons_posterior/1")
    samples = model.predict(x_obs, params={"num_samples": 1000, "seed": 0})
    # DataFrame: observation (row of x_obs), theta_0 … theta_{d-1}; num_samples rows per x

The model holds ``posterior.pt`` (``export.py``) as its artifact and, as code, the part of
trainforge that loads and samples it and the user's modules it needs (a custom task's prior, an
embedding net or a builder by import path), so it loads where trainforge is not installed
(``posterior_model.log_pyfunc`` logs it). This module is what loads: the model's class and
its schema.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch
from mlflow.models import ModelSignature
from mlflow.pyfunc import PythonModel
from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema, TensorSpec

DEFAULT_SAMPLES = 1000


class PosteriorModel(PythonModel):  # type: ignore[misc]  # mlflow's base class is untyped
    """Posterior samples for given observations (``num_samples`` per row, seeded by ``seed``)."""

    # MLflow 3 wraps a subclass's predict for validation by its type hints and, when the input
    # has none (deliberately: see predict), warns in colour at class creation — a line that
    # reached the user's console at the end of every SBI run, past any warnings filter (MLflow
    # raises it under its own). Its own escape hatch for classes it should not wrap:
    _skip_type_hint_validation = True

    def load_context(self, context: Any) -> None:
        from trainforge.workloads.sbi.export import load_posterior

        self.posterior = load_posterior(context.artifacts["posterior"])

    # model_input carries no type hint: MLflow would build a schema from it (the signature
    # given to ``log`` describes the input)
    def predict(self, context: Any, model_input, params: Any = None) -> pd.DataFrame:
        params = params or {}
        num_samples = int(params.get("num_samples", DEFAULT_SAMPLES))
        x = torch.as_tensor(np.asarray(model_input, dtype=np.float32))
        x = x.reshape(1, -1) if x.dim() == 1 else x
        torch.manual_seed(int(params.get("seed", 0)))
        frames = []
        for row, x_obs in enumerate(x):
            theta = self.posterior.sample((num_samples,), x=x_obs, show_progress_bars=False)
            frame = pd.DataFrame(theta.numpy(), columns=theta_columns(theta.shape[1]))
            frame.insert(0, "observation", row)
            frames.append(frame)
        return pd.concat(frames, ignore_index=True)


def theta_columns(dim_theta: int) -> list[str]:
    return [f"theta_{i}" for i in range(dim_theta)]


def signature(dim_theta: int, dim_x: int) -> ModelSignature:
    columns: list[ColSpec | TensorSpec] = [ColSpec("long", "observation")]
    columns += [ColSpec("float", name) for name in theta_columns(dim_theta)]
    return ModelSignature(
        inputs=Schema([TensorSpec(np.dtype(np.float32), (-1, dim_x))]),
        outputs=Schema(columns),
        params=ParamSchema(
            [ParamSpec("num_samples", "long", DEFAULT_SAMPLES), ParamSpec("seed", "long", 0)]
        ),
    )
