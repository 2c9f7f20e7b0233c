"""The posterior as an MLflow pyfunc model (``trainforge.workloads.sbi.pyfunc``): logged into a
real SQLite store, registered, loaded back by its registry URI, and sampled."""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch

from tests.unit.sbi_helpers import _data
from trainforge.workloads.sbi import estimator as estimators
from trainforge.workloads.sbi import export, posterior_model, pyfunc
from trainforge.workloads.sbi.config import EstimatorSection, SBIWorkloadConfig
from trainforge.workloads.sbi.workload import SBIWorkload


def test_the_registered_posterior_loads_and_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("sbi")
    theta, x = _data()
    record = estimators.BuildRecord.from_config(EstimatorSection(), 2, 2)
    estimator = estimators.build(record, theta, x).eval()
    path = tmp_path / "model" / "posterior.pt"
    export.save_posterior(path, estimator, record, {"task": "two_moons"})
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    with mlflow.start_run():
        info = pyfunc.log(posterior_model.PosteriorExport(path, x[:2].numpy(), 2))
    version = mlflow.register_model(info.model_uri, "two_moons_posterior").version
    path.unlink()  # what loads is the registered copy

    model = mlflow.pyfunc.load_model(f"models:/two_moons_posterior/{version}")
    x_obs = x[:3].numpy()
    samples = model.predict(x_obs, params={"num_samples": 200, "seed": 1})
    assert list(samples.columns) == ["observation", "theta_0", "theta_1"]
    assert samples["observation"].tolist() == [0] * 200 + [1] * 200 + [2] * 200
    values = samples[["theta_0", "theta_1"]].to_numpy()
    assert np.isfinite(values).all() and ((values >= -1) & (values <= 1)).all()  # prior box
    again = model.predict(x_obs, params={"num_samples": 200, "seed": 1})
    assert again.equals(samples)  # the seed fixes the draws
    # the same distribution as the posterior object sbi users load: close means
    ours = torch.tensor(values[:200]).mean(0)
    posterior = _loaded_posterior(estimator, record, tmp_path)
    theirs = posterior.sample((2000,), x=x[0], show_progress_bars=False).mean(0)
    torch.testing.assert_close(ours.float(), theirs, atol=0.1, rtol=0)
    assert model.metadata.get_params_schema().to_dict()[0]["name"] == "num_samples"


def _loaded_posterior(estimator: torch.nn.Module, record: object, folder: Path) -> object:
    again = folder / "again.pt"
    export.save_posterior(again, estimator, record, {"task": "two_moons"})  # type: ignore[arg-type]
    return export.load_posterior(again)


def test_the_sbi_workload_logs_its_posterior_not_its_two_input_loss_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The pytorch flavour infers a signature by calling the module with one input; the NPE
    loss takes (θ, x) and failed with a TypeError. The workload hands the tracker a pyfunc."""
    theta, x = _data()
    workload = SBIWorkload(SBIWorkloadConfig(), seed=0)
    workload.train_theta, workload.train_x, workload.dim_theta, workload.dim_x = theta, x, 2, 2
    model = workload.build_model()
    log = workload.mlflow_model(model, tmp_path)
    assert callable(log) and (tmp_path / "posterior.pt").is_file()
    with pytest.raises(TypeError):
        model(theta[:2])  # what mlflow.pytorch.log_model's signature inference would do
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
    with mlflow.start_run():
        info = log()
    loaded = mlflow.pyfunc.load_model(info.model_uri)
    assert loaded.predict(x[:1].numpy(), params={"num_samples": 5}).shape == (5, 3)


def test_the_model_class_brings_no_mlflow_warning_to_the_console() -> None:
    """MLflow warns in colour, at class creation, about predict's missing type hint; every
    SBI run printed it at its end."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import trainforge.workloads.sbi.pyfunc"],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "type hint" not in done.stderr
