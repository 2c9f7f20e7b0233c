"""The posterior as an MLflow pyfunc model (``trainforge.workloads.sbi.pyfunc``): logged into a
real SQLite store, registered, loaded back by its registry URI, and sampled; shipping only the
part of trainforge and of the user's project that loads it, it loads in a new process where
neither is importable."""

from __future__ import annotations

from pathlib import Path

import mlflow
import numpy as np
import pytest
import torch

from tests.unit.sbi_helpers import _data
from trainforge.workloads.sbi import estimator as estimators
from trainforge.workloads.sbi import export, posterior_model
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
    monkeypatch.chdir(tmp_path)  # the store's Default experiment keeps its artifacts in ./mlruns
    with mlflow.start_run():
        info = posterior_model.log_pyfunc(posterior_model.PosteriorExport(path, x[:2].numpy(), 2))
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
    monkeypatch.chdir(tmp_path)  # the store's Default experiment keeps its artifacts in ./mlruns
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


# A custom task's project: its prior, and the embedding net and builder the recipe names, in a
# package; its simulator, which loading the posterior does not need
USERS_SBI = {
    "my_sbi/__init__.py": "",
    "my_sbi/priors.py": """
import torch
from sbi.utils import BoxUniform


def prior():
    return BoxUniform(low=-torch.ones(2), high=torch.ones(2))
""",
    "my_sbi/nets.py": """
import torch
from torch import nn

from .priors import prior  # noqa: F401


class Features(nn.Module):
    def __init__(self, dim_x, width=4):
        super().__init__()
        self.layer = nn.Linear(dim_x, width)

    def forward(self, x):
        return torch.tanh(self.layer(x))


def small_maf(theta, x, embedding_net):
    from sbi.neural_nets.net_builders import build_maf

    return build_maf(theta, x, num_transforms=1, embedding_net=embedding_net)
""",
    "my_sbi/simulator.py": "def simulate(theta):\n    return theta + 0.1\n",
}

# The logged posterior loaded by its URI in a new process whose only trainforge is the model's
# code (the editable install's finder taken out, no PYTHONPATH): what could be imported before,
# the samples' shape, and where each trainforge and user module it imported came from
LOAD_POSTERIOR = """
import importlib.util, json, sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in f.__module__]
before = [n for n in ("trainforge", "my_sbi") if importlib.util.find_spec(n) is not None]
import mlflow.pyfunc, numpy as np
model = mlflow.pyfunc.load_model(sys.argv[1])
samples = model.predict(np.zeros((2, 2), dtype=np.float32), params={"num_samples": 5})
files = {name: getattr(module, "__file__", None) for name, module in sys.modules.items()
         if name.split(".")[0] in ("trainforge", "my_sbi")}
print(json.dumps({"before": before, "shape": list(samples.shape), "files": files}))
"""


def test_the_posterior_ships_only_what_loads_it_and_loads_where_trainforge_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A custom task's posterior with the user's embedding net and builder: its code is the
    part of trainforge that loading and sampling import and the user's modules it names (not
    their simulator), and it samples in a new process, in another folder, where neither
    trainforge nor the user's project can be imported."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("sbi")
    project = tmp_path / "project"
    for name, text in USERS_SBI.items():
        (project / name).parent.mkdir(parents=True, exist_ok=True)
        (project / name).write_text(text)
    monkeypatch.syspath_prepend(str(project))
    cfg = SBIWorkloadConfig(
        task="custom", prior="my_sbi.priors:prior", simulator="my_sbi.simulator:simulate",
        code_dir=str(project),
        estimator=EstimatorSection(model="my_sbi.nets:small_maf", embedding="my_sbi.nets:Features"),
    )  # fmt: skip
    theta, x = _data()
    workload = SBIWorkload(cfg, seed=0)
    workload.train_theta, workload.train_x, workload.dim_theta, workload.dim_x = theta, x, 2, 2
    try:
        model = workload.build_model()
        log = workload.mlflow_model(model, tmp_path / "model")
        client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/mlflow.db")
        experiment = client.create_experiment("e", artifact_location=str(tmp_path / "artifacts"))
        monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path}/mlflow.db")
        with mlflow.start_run(experiment_id=experiment):
            info = log()
    finally:
        for name in [n for n in sys.modules if n.split(".")[0] == "my_sbi"]:
            del sys.modules[name]

    code = tmp_path / "model" / posterior_model.CODE_FOLDER
    shipped = sorted(str(f.relative_to(code)) for f in code.rglob("*") if f.is_file())
    assert [f for f in shipped if not f.startswith("trainforge/")] == [
        "my_sbi/__init__.py", "my_sbi/nets.py", "my_sbi/priors.py"]  # fmt: skip
    assert "trainforge/workloads/sbi/export.py" in shipped
    # none of the driver, the worker, the CLI, the simulation stage or the CNN family
    assert not any(f.startswith(("trainforge/driver/", "trainforge/worker/", "trainforge/cli",
                                 "trainforge/workloads/cnn/", "trainforge/workloads/sbi/simulate"))
                   for f in shipped)  # fmt: skip
    size = sum((code / f).stat().st_size for f in shipped)
    assert size < 250_000, size  # all of trainforge is ~0.9 MB
    project.rename(tmp_path / "moved")  # nowhere to import the user's modules from but the model

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    keep = ("PATH", "HOME", "OMP_NUM_THREADS", "MLFLOW_DISABLE_TELEMETRY", "MLFLOW_TRACKING_URI")
    env = {key: os.environ[key] for key in keep if key in os.environ}
    loaded = subprocess.run([sys.executable, "-c", LOAD_POSTERIOR, info.model_uri],
                            capture_output=True, text=True, timeout=300, cwd=elsewhere,
                            env=env)  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    said = json.loads(loaded.stdout.splitlines()[-1])
    assert said["before"] == []
    assert said["shape"] == [10, 3]
    assert {"my_sbi.priors", "my_sbi.nets", "trainforge.workloads.sbi.export"} <= set(said["files"])
    for name, file in said["files"].items():
        assert file is None or f"{os.sep}code{os.sep}" in file, (name, file)
