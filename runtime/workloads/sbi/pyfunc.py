"""The trained posterior as an MLflow model (``pyfunc`` flavour), so it can be registered,
loaded with ``mlflow.pyfunc.load_model`` and served: ``predict`` takes observations x (one per
row) and returns posterior samples θ ~ q(θ | x).

    model = mlflow.pyfunc.load_model("models:/two_moons_posterior/1")
    samples = model.predict(x_obs, params={"num_samples": 1000, "seed": 0})
    # DataFrame: observation (row of x_obs), theta_0 … theta_{d-1}; num_samples rows per x

The model holds ``posterior.pt`` (``export.py``) as its artifact and this package (plus a
custom task's prior module) as code, so it loads where trainforge is not installed.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow.pyfunc
import numpy as np
import pandas as pd
import torch
from mlflow.models import ModelSignature
from mlflow.pyfunc import PythonModel
from mlflow.types import ColSpec, ParamSchema, ParamSpec, Schema, TensorSpec

if TYPE_CHECKING:
    from trainforge.workloads.sbi.posterior_model import PosteriorExport


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


def log(export: PosteriorExport, name: str = "posterior", model_id: str | None = None) -> Any:
    """Log the model into the active MLflow run, or as the logged model ``model_id`` (made
    beforehand, ``mlflow.initialize_logged_model``); returns MLflow's ModelInfo."""
    import sbi

    import trainforge

    requirements = [
        f"torch=={torch.__version__.split('+')[0]}", f"sbi=={sbi.__version__}",
        f"numpy=={np.__version__}", f"pandas=={pd.__version__}",
    ]  # fmt: skip
    folder = export.posterior_file.parent / "pyfunc-code"
    # MLflow names a code copy after its folder, and a checkout's folder is runtime/
    package = folder / "trainforge"
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(
        Path(trainforge.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__")
    )
    code = [str(package), *(_module_path(m) for m in export.user_modules)]
    return mlflow.pyfunc.log_model(
        name=name,
        python_model=PosteriorModel(),
        artifacts={"posterior": str(export.posterior_file)},
        code_paths=[c for c in code if c],
        signature=signature(export.dim_theta, export.example_x.shape[1]),
        input_example=export.example_x.astype(np.float32),
        pip_requirements=requirements,
        model_id=model_id,
    )


def _module_path(module_name: str) -> str:
    """The file or package folder of an imported user module's top-level package."""
    top = sys.modules.get(module_name.split(".")[0])
    file = getattr(top, "__file__", None)
    if file is None:
        return ""
    path = Path(file)
    return str(path.parent if path.name == "__init__.py" else path)
