"""GPU tier for SBI: the CUDA-graph optimizer step against the eager one, and SBI recipes on
GPUs through Ray Train (simulation on the GPU, one worker with CUDA graphs, two over NCCL)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from runtime import config, launch
from runtime.cuda_graph import GraphedStep
from runtime.optim import build_optimizer
from runtime.precision import Precision
from runtime.trainer import optimizer_step
from runtime.workloads.sbi import load_posterior
from runtime.workloads.sbi.config import SBIWorkloadConfig
from runtime.workloads.sbi.tasks import get_task
from runtime.workloads.sbi.workload import SBIWorkload

pytestmark = [pytest.mark.gpu]

DEBUG = Path(__file__).resolve().parents[2] / "recipes" / "sbi" / "two_moons_debug.yaml"


def test_graphed_step_matches_the_eager_step() -> None:
    device = torch.device("cuda", 0)
    task = get_task("two_moons")
    generator = torch.Generator().manual_seed(0)
    theta = task.prior_sample(4096, generator)
    x = task.simulate(theta, generator)
    cfg = OmegaConf.structured(SBIWorkloadConfig)
    workload = SBIWorkload(cfg, seed=0)
    workload.train_theta, workload.train_x, workload.dim_theta, workload.dim_x = theta, x, 2, 2
    train = OmegaConf.create(
        {"optimizer": "adam", "lr": 1e-3, "weight_decay": 0.0, "momentum": 0.0}
    )
    batches = [
        (theta[i : i + 256].to(device), x[i : i + 256].to(device)) for i in range(0, 4096, 256)
    ]
    precision = Precision("fp32", device)

    torch.manual_seed(0)
    eager_model = workload.build_model().to(device)
    eager_opt = build_optimizer(eager_model, train)
    eager = [
        optimizer_step(eager_model, [b], workload, precision, eager_opt, 5.0)[0].item()
        for b in batches
    ]
    torch.manual_seed(0)
    graph_model = workload.build_model().to(device)
    graph_opt = build_optimizer(graph_model, train, capturable=True)
    step = GraphedStep(graph_model, workload, graph_opt, 5.0, batches[0], precision.autocast)
    graphed = [step(*b)[0].item() for b in batches]

    # same first loss: the warm-up steps before capture were undone
    assert graphed[0] == pytest.approx(eager[0], rel=1e-5)
    assert graphed == pytest.approx(eager, rel=2e-3, abs=2e-3)
    for a, b in zip(eager_model.parameters(), graph_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


@pytest.mark.ray
def test_sbi_recipe_on_one_gpu_with_cuda_graphs(ray_cluster, in_tmp: Path) -> None:
    cfg = config.load(
        DEBUG,
        ["run.name=sbi-graphs", "scaling.num_workers=1", "scaling.use_gpu=true",
         "precision.cuda_graphs=true", "workload.simulation.device=cuda",
         "tracking.enabled=false", "train.epochs=20",
         "workload.simulation.num_simulations=10000"],
    )  # fmt: skip
    outcome = launch.train(cfg)
    assert outcome.exit_code == 0 and outcome.backend == "nccl"
    assert outcome.metrics["val/loss"] < 0.5  # two_moons NPE starts near 1.4
    assert outcome.metrics["c2st/obs1"] < 0.9
    posterior = load_posterior(in_tmp / "runs" / "sbi-graphs" / "posterior.pt")
    _, x_obs = get_task("two_moons").observation(1)
    assert posterior.sample((100,), x=x_obs, show_progress_bars=False).shape == (100, 2)


@pytest.mark.ray
def test_sbi_recipe_on_two_gpus_over_nccl(ray_cluster, in_tmp: Path) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    cfg = config.load(
        DEBUG,
        ["run.name=sbi-ddp", "scaling.num_workers=2", "scaling.use_gpu=true",
         "tracking.enabled=false", "workload.simulation.device=cuda"],
    )  # fmt: skip
    outcome = launch.train(cfg)
    assert outcome.exit_code == 0 and outcome.num_workers == 2
    assert outcome.metrics["val/loss"] < 1.0


def test_a_step_that_cannot_be_captured_falls_back_to_eager() -> None:
    """nflows' NSF checks its spline domain with data-dependent Python branches; whether or
    not it captures, training must go on with the weights the warm-up found untouched."""
    device = torch.device("cuda", 0)
    theta, x = torch.randn(512, 2), torch.randn(512, 2)
    cfg = OmegaConf.structured(SBIWorkloadConfig)
    cfg.estimator.model = "nsf"
    workload = SBIWorkload(cfg, seed=0)
    workload.train_theta, workload.train_x, workload.dim_theta, workload.dim_x = theta, x, 2, 2
    train = OmegaConf.create({"optimizer": "adam", "lr": 1e-3, "weight_decay": 0.0})
    model = workload.build_model().to(device)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    optimizer = build_optimizer(model, train, capturable=True)
    batch = (theta[:256].to(device), x[:256].to(device))
    step = GraphedStep(model, workload, optimizer, 5.0, batch, Precision("fp32", device).autocast)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(value, before[key])
    if step.captured:
        loss, _ = step(*batch)
    else:
        loss, _ = optimizer_step(
            model, [batch], workload, Precision("fp32", device), optimizer, 5.0
        )
    assert torch.isfinite(loss)
