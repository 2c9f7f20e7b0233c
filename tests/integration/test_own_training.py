"""End to end on a command's own worker processes (``driver/workers/own.py``), the path of a
local command with no cluster to use: accumulation parity and SBI's simulations streamed from
disk to two ranks, the loop's properties on any path. Each run is a real ``trainforge train`` in
a child process that no Ray is joined to, with no cluster kept (TRAINFORGE_WORKERS=own), as a
user's command; the same checks through Ray Train's worker groups took 180 s of a suite run on
2 cores. Restarts and resumes on every worker group: test_worker_groups.py."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainforge import checkpoint

pytestmark = pytest.mark.slow

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
DIGITS = RECIPES / "cnn" / "digits_simple_cnn.yaml"
SBI_DEBUG = RECIPES / "sbi" / "two_moons_debug.yaml"
OWN_PATH = "this run's workers are processes of this command"


def train(
    folder: Path, *overrides: str, recipe: Path = DIGITS, **extra_env: str
) -> subprocess.CompletedProcess[str]:
    """``trainforge train`` of ``recipe`` in ``folder``, on the command's own workers."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(TRAINFORGE_WORKERS="own", **extra_env)
    done = subprocess.run(
        [sys.executable, "-m", "trainforge", "train", str(recipe), *overrides], cwd=folder,
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert OWN_PATH in done.stdout + done.stderr, done.stdout + done.stderr
    return done


def weights(folder: Path, run_name: str) -> dict[str, torch.Tensor]:
    return final_state(folder, run_name)["model"]


def final_state(folder: Path, run_name: str) -> dict:
    found = checkpoint.newest_in(folder / "runs" / run_name)
    assert found.state is not None and not found.skipped, found.warning()
    return found.state


def test_accumulation_matches_more_workers(tmp_path: Path) -> None:
    """1 worker × 2 micro-steps == 2 workers × 1 micro-step: same samples per optimizer step
    (DistributedSampler shards one permutation), same mean gradient."""
    common = ["train.max_steps=12", "train.batch_size=16", "train.optimizer=sgd", "train.lr=0.05",
              "tracking.enabled=false"]  # fmt: skip
    runs = {
        "accum": ["scaling.num_workers=1", "train.grad_accum_steps=2"],
        "ddp": ["scaling.num_workers=2", "train.grad_accum_steps=1"],
        "one-step": ["scaling.num_workers=1", "train.max_steps=1"],
    }
    said = {}
    for name, overrides in runs.items():
        done = train(tmp_path, f"run.name={name}", *common, *overrides)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        said[name] = done.stdout + done.stderr
    assert "training 12 steps over 1 epoch on 1 worker (cpu)" in said["accum"]
    assert "training 12 steps over 1 epoch on 2 workers (cpu)" in said["ddp"]
    a, b = weights(tmp_path, "accum"), weights(tmp_path, "ddp")
    assert final_state(tmp_path, "accum")["global_step"] == 12
    assert final_state(tmp_path, "ddp")["global_step"] == 12
    for name in a:
        torch.testing.assert_close(a[name], b[name], rtol=1e-5, atol=1e-6, msg=name)
    # and training did move the weights (the comparison is not vacuous)
    one_step = weights(tmp_path, "one-step")
    assert all(not torch.allclose(one_step[name], a[name]) for name in a)


def test_sbi_streamed_from_disk_trains_on_two_workers(tmp_path: Path) -> None:
    # 10 chunks of 500 simulations read in windows of 1,000 rows: both DDP ranks must make the
    # same number of steps from their own chunks, or the run hangs
    done = train(
        tmp_path, "run.name=npe-stream", "workload.stream_from_disk=true",
        "workload.stream_window_rows=1000", "workload.simulation.chunk_size=500",
        "train.epochs=12", "workload.evaluation.c2st=false", "workload.evaluation.sbc_runs=0",
        "workload.evaluation.pair_plot=false", "tracking.enabled=false", recipe=SBI_DEBUG,
    )  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    assert re.search(r"training \d+ steps over 12 epochs on 2 workers \(cpu\)", said), said
    (val_loss,) = re.findall(r"^\[trainforge\] +val/loss +(\S+)$", said, re.M)
    assert float(val_loss) < -0.8, said[-2000:]  # an untrained MAF: about 1.5


USERS_CODE = """
import torch
from torch import nn
from torch.utils.data import Dataset


class FlatNet(nn.Module):
    def __init__(self, in_channels, num_classes, image_size, hidden=32):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(), nn.Linear(in_channels * image_size**2, hidden), nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, x):
        return self.layers(x)


def noisy_bars(seed, image_size, size, channels=2):
    # class 0: a bright row, class 1: a bright column, somewhere in the image, in noise
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 2, (size,), generator=generator)
    where = torch.randint(0, image_size, (size,), generator=generator)
    images = torch.randn(size, channels, image_size, image_size, generator=generator) * 0.3
    for i in range(size):
        if labels[i] == 0:
            images[i, :, where[i], :] += 2.0
        else:
            images[i, :, :, where[i]] += 2.0
    return images, labels


class Bars(Dataset):
    def __init__(self, seed, image_size, size):
        self.images, self.labels = noisy_bars(seed, image_size, size)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.images[index], int(self.labels[index])


def bars(seed, image_size, size=1024):
    return Bars(seed, image_size, size), noisy_bars(seed + 1, image_size, size // 4)
"""


def test_a_cnn_recipe_trains_the_users_own_model_on_the_users_own_data(tmp_path: Path) -> None:
    """The digits recipe with ``workload.model`` and ``workload.dataset`` naming a class and a
    function of the user's project (beside the command, outside the repository), the model's
    ``model_kwargs`` overridden: its training split a Dataset streamed through a DataLoader
    whose worker process imports the user's module, trained on two workers to a useful
    accuracy; ``trainforge.load`` gives back that class, shaped by the data's channels, and so
    does MLflow's ``load_model`` of the run's model in another folder, where neither the user's
    module nor trainforge can be imported but from the model's own code."""
    (tmp_path / "my_code.py").write_text(USERS_CODE)
    done = train(tmp_path, "workload.model=my_code:FlatNet", "workload.model_kwargs.hidden=48",
                 "workload.dataset=my_code:bars", "workload.num_classes=2",
                 "workload.image_size=8", "workload.loader_workers=1", "train.epochs=3",
                 "run.name=own-net", "tracking.system_metrics=false")  # fmt: skip
    said = done.stdout + done.stderr
    assert done.returncode == 0, said[-3000:]
    accuracy = float(re.findall(r"val/accuracy\s+([\d.]+)", said)[-1])
    assert accuracy > 0.9, said[-2000:]
    loaded = subprocess.run(
        [sys.executable, "-c", "import trainforge, sys; m = trainforge.load(sys.argv[1]); "
         "print(type(m).__name__, m.layers[1].in_features, m.layers[1].out_features)",
         str(tmp_path / "runs" / "own-net")],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert loaded.stdout.split() == ["FlatNet", str(2 * 8 * 8), "48"], loaded.stdout + loaded.stderr
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {key: os.environ[key] for key in ("PATH", "HOME", "OMP_NUM_THREADS") if key in os.environ}
    from_mlflow = subprocess.run(
        [sys.executable, "-c", LOAD_FROM_MLFLOW, f"sqlite:///{tmp_path / 'mlflow.db'}",
         str(tmp_path / "my_code.py")],
        cwd=elsewhere, capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    said = from_mlflow.stdout + from_mlflow.stderr
    assert from_mlflow.stdout.split() == ["flat_net", "FlatNet", "2x2", "False"], said[-3000:]


# The run's one logged model loaded by MLflow in a process that imports neither the user's
# module nor trainforge but from the model's code (the editable install's finder taken out, no
# PYTHONPATH): its name, class, output shape, and whether my_code came from the user's folder
LOAD_FROM_MLFLOW = """
import sys
sys.meta_path[:] = [f for f in sys.meta_path if "__editable__" not in f.__module__]
import mlflow, mlflow.pytorch, torch
mlflow.set_tracking_uri(sys.argv[1])
experiments = [e.experiment_id for e in mlflow.search_experiments()]
[logged] = mlflow.search_logged_models(experiment_ids=experiments, output_format="list")
model = mlflow.pytorch.load_model(f"models:/{logged.model_id}")
output = model(torch.ones(2, 2, 8, 8))
users = sys.modules["my_code"].__file__ == sys.argv[2]
print(logged.name, type(model).__name__, "x".join(map(str, output.shape)), users)
"""
