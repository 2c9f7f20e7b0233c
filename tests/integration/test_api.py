"""The Python API (``trainforge.train``, ``trainforge.load``; ``runtime/api.py``) as a notebook
or a script uses it: a script in a user's project trains the example workload from a mapping,
gets its result and the trained model back, trains more runs in the same process (the recipe as
a file, and a shipped SBI recipe by its name whose model is sbi's posterior; overrides as a
mapping and as a list), and meets refusals and a failed run as exceptions carrying the
command's one-line messages."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests import faults

pytestmark = pytest.mark.slow

WAVE = Path(__file__).resolve().parents[2] / "examples" / "wave"

SCRIPT = """
import json, os, sys
from pathlib import Path
import torch
import trainforge

recipe = json.loads(sys.argv[1])
said = {}
first = trainforge.train(recipe, {"train.epochs": 2, "tracking.system_metrics": False})
said["metrics"] = first.metrics
said["checkpoint"] = first.checkpoint
said["run_id"] = first.run_id

# the trained model, from the run's folder: its own error on data made as the workload makes them
model = trainforge.load("runs/wave-regression")
from wave_task import WaveConfig, WaveRegression
data = WaveRegression(WaveConfig(hidden=64), seed=0).datasets(torch.device("cpu"))
x, y = data[1]
with torch.no_grad():
    said["reloaded_val_loss"] = float(torch.nn.functional.mse_loss(model(x), y))
said["model_type"] = type(model).__name__
said["same_model"] = all(
    torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                      first.load().state_dict().values())
)

# a second run in the same process, with command-line style overrides
import time
from mlflow.tracking import MlflowClient
called = time.time()
second = trainforge.train(recipe, ["run.name=second", "train.epochs=1",
                                   "tracking.system_metrics=false"])
said["second_epoch"] = second.metrics["epoch"]
# its MLflow run starts when this call did, not when the process imported trainforge
started = MlflowClient(second.tracking_uri).get_run(second.run_id).info.start_time / 1000
said["second_start_lag_s"] = started - called

try:
    trainforge.train(recipe, {"train.batch_size": 0})
except trainforge.RecipeError as exc:
    said["refused"] = str(exc)
try:  # a key no recipe has, with the recipe as a file, as the command is given it
    trainforge.train("recipe.yaml", ["train.bogus=1"])
except trainforge.RecipeError as exc:
    said["bad_key"] = str(exc)

# the recipe as a file (a narrower model than the example's), overrides as a mapping
from_file = trainforge.train("narrow.yaml", {"run.name": "from-file", "train.epochs": 1,
                                             "tracking.system_metrics": False})
said["from_file"] = [from_file.metrics["epoch"], Path(from_file.checkpoint).parent.name,
                     from_file.load()[0].out_features]

# a shipped recipe by its name, overrides as a list: SBI, whose load is sbi's posterior
sbi = trainforge.train("sbi/two_moons_debug", [
    "run.name=sbi-api", "scaling.num_workers=1", "train.epochs=2",
    "workload.simulation.num_simulations=1000", "workload.evaluation.c2st=false",
    "workload.evaluation.sbc_runs=0", "workload.evaluation.pair_plot=false",
    "workload.evaluation.num_samples=100"])
posterior = sbi.load()
samples = posterior.sample((50,), x=torch.tensor([0.1, -0.2]), show_progress_bars=False)
again = trainforge.load("runs/sbi-api").sample((5,), x=torch.tensor([0.1, -0.2]),
                                               show_progress_bars=False)
said["sbi"] = [type(posterior).__name__, list(samples.shape), list(again.shape),
               sbi.metrics["epoch"], sbi.recipe.workload.estimator.hidden_features,
               sbi.recipe.workload.simulation.num_simulations]

os.environ[sys.argv[2]] = "40"  # the test's fault: the last rank raises at step 40
try:
    trainforge.train(recipe, {"run.name": "failing", "train.epochs": 2,
                              "tracking.system_metrics": False})
except trainforge.RunFailed as exc:
    said["failed"] = [str(exc), exc.exit_code]
print("RESULT " + json.dumps(said))
"""


def test_a_script_trains_loads_and_meets_errors_as_exceptions(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    shutil.copy(WAVE / "wave_task.py", project)
    shutil.copy(WAVE / "recipe.yaml", project)
    recipe = yaml.safe_load((WAVE / "recipe.yaml").read_text())
    narrow = (WAVE / "recipe.yaml").read_text().replace("hidden: 64", "hidden: 16")
    (project / "narrow.yaml").write_text(narrow)
    env = faults.env()  # the plugin; the script asks for its fault before its last run
    env.update(TRAINFORGE_WORKERS="own", TRAINFORGE_HOME=str(tmp_path / "home"))
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(recipe), faults.RAISE_AT_STEP],
        cwd=project, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    said = json.loads(out.split("RESULT ", 1)[1].splitlines()[0])
    metrics = said["metrics"]
    assert metrics["epoch"] == 2 and metrics["val/rmse"] < 0.5, metrics
    assert Path(said["checkpoint"]).parent == project / "runs" / "wave-regression"
    assert said["run_id"], out[-4000:]
    # the model back from the run's folder computes the run's own validation loss
    assert said["model_type"] == "Sequential" and said["same_model"]
    assert said["reloaded_val_loss"] == pytest.approx(metrics["val/loss"], rel=1e-4)
    assert said["second_epoch"] == 1
    assert -0.1 < said["second_start_lag_s"] < 5, said["second_start_lag_s"]
    assert said["refused"] == "train.batch_size: must be >= 1, got 0"
    # a bad key: the command's one line, as the command says it
    command = subprocess.run(
        [sys.executable, "-m", "trainforge", "train", "recipe.yaml", "train.bogus=1"],
        cwd=project, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert command.returncode == 2 and "train.bogus" in said["bad_key"], said["bad_key"]
    assert command.stderr.splitlines() == [f"trainforge: error: {said['bad_key']}"]
    # the file's narrower model, trained for the mapping's one epoch into its run's folder
    assert said["from_file"] == [1, "from-file", 16]
    # the shipped recipe (its 32 hidden features, not the default 50; its task's 2-d θ) with
    # the list's settings
    assert said["sbi"] == ["DirectPosterior", [50, 2], [5, 2], 2, 32, 1000]
    message, code = said["failed"]
    assert code == 1 and "run 'failing' did not finish (exit status 1" in message
    assert os.path.isdir(project / "runs" / "failing")  # its checkpoint is kept
