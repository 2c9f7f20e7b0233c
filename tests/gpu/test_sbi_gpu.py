"""GPU tier for SBI: the CUDA-graph optimizer step against the eager one, and SBI recipes on
GPUs through Ray Train (simulation on the GPU, one worker with CUDA graphs, two over NCCL)."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from omegaconf import OmegaConf
from torch import nn

from trainforge import config, distributed
from trainforge.distributed import WorkerContext
from trainforge.driver import launch
from trainforge.optim import build_optimizer
from trainforge.precision import Precision
from trainforge.worker.step import GraphedStep, optimizer_step
from trainforge.workloads.sbi import load_posterior
from trainforge.workloads.sbi.config import EstimatorSection, SBIWorkloadConfig
from trainforge.workloads.sbi.tasks import get_task
from trainforge.workloads.sbi.workload import SBIWorkload

pytestmark = [pytest.mark.gpu]

DEBUG = Path(__file__).resolve().parents[2] / "recipes" / "sbi" / "two_moons_debug.yaml"


def two_moons_steps(
    device: torch.device, batches_from: int = 0
) -> tuple[SBIWorkload, list[tuple[torch.Tensor, torch.Tensor]]]:
    """A two_moons workload (z-scored on 4,096 simulations) and 16 batches of 256 on the device;
    ``batches_from`` picks other batches from a longer run of simulations (one set per rank)."""
    task = get_task("two_moons")
    generator = torch.Generator().manual_seed(0)
    theta = task.prior_sample(4096 + batches_from, generator)
    x = task.simulate(theta, generator)
    workload = SBIWorkload(SBIWorkloadConfig(), seed=0)
    workload.train_theta, workload.train_x = theta[:4096], x[:4096]
    workload.dim_theta, workload.dim_x = 2, 2
    batches = [
        (theta[i : i + 256].to(device), x[i : i + 256].to(device))
        for i in range(batches_from, batches_from + 4096, 256)
    ]
    return workload, batches


def eager_and_graphed_losses(
    device: torch.device, batches_from: int = 0, ctx: WorkerContext | None = None
) -> tuple[list[float], list[float], nn.Module, nn.Module]:
    """The same 16 optimizer steps, eager and replayed from a CUDA graph (under DDP when a
    context with several ranks is given): (eager losses, graphed losses, the two models)."""
    workload, batches = two_moons_steps(device, batches_from)
    train = OmegaConf.create({"optimizer": "adam", "lr": 1e-3, "weight_decay": 0.0})
    precision = Precision("fp32", device)
    ctx = ctx or WorkerContext(0, 0, 1, 0, device)

    torch.manual_seed(0)
    eager_model = workload.build_model().to(device)
    eager_opt = build_optimizer(eager_model, train)
    eager_step = distributed.wrap(eager_model, ctx)
    eager = [
        optimizer_step(eager_step, [b], workload, precision, eager_opt, 5.0)[0].item()
        for b in batches
    ]
    torch.manual_seed(0)
    graph_model = workload.build_model().to(device)
    graph_opt = build_optimizer(graph_model, train, capturable=True)
    graph_step = distributed.wrap(graph_model, ctx, cuda_graphs=True)
    step = GraphedStep(graph_step, workload, graph_opt, 5.0, batches[0], precision.autocast)
    assert step.captured, step.error
    graphed = [step(b)[0].item() for b in batches]
    return eager, graphed, eager_model, graph_model


def assert_same_training(
    eager: list[float], graphed: list[float], eager_model: nn.Module, graph_model: nn.Module
) -> None:
    # same first loss: the warm-up steps before capture were undone
    assert graphed[0] == pytest.approx(eager[0], rel=1e-5)
    assert graphed == pytest.approx(eager, rel=2e-3, abs=2e-3)
    for a, b in zip(eager_model.parameters(), graph_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def test_graphed_step_matches_the_eager_step() -> None:
    assert_same_training(*eager_and_graphed_losses(torch.device("cuda", 0)))


def _ddp_rank(rank: int, world: int, port: int) -> None:
    torch.cuda.set_device(rank)
    device = torch.device("cuda", rank)
    dist.init_process_group(
        "nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        device_id=device,
    )  # fmt: skip
    try:
        ctx = WorkerContext(rank, rank, world, 0, device)
        eager, graphed, eager_model, graph_model = eager_and_graphed_losses(
            device, batches_from=4096 * rank, ctx=ctx
        )
        assert_same_training(eager, graphed, eager_model, graph_model)
        # the captured all-reduce kept the ranks identical, as eager DDP does
        flat = torch.cat([p.detach().flatten() for p in graph_model.parameters()])
        gathered = [torch.empty_like(flat) for _ in range(world)]
        dist.all_gather(gathered, flat)
        for other in gathered[1:]:
            torch.testing.assert_close(other, gathered[0], rtol=0, atol=0)
        losses = torch.tensor(eager[:1], device=device)
        everyone = [torch.empty_like(losses) for _ in range(world)]
        dist.all_gather(everyone, losses)
        assert everyone[0].item() != everyone[1].item()  # the ranks did see different batches
    finally:
        dist.destroy_process_group()


def test_graphed_ddp_step_matches_the_eager_ddp_step() -> None:
    """DDP's gradient all-reduce captured inside the graph: on two GPUs, each rank's losses and
    weights follow eager DDP's, and the ranks' weights stay bitwise equal."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    mp.start_processes(_ddp_rank, (2, port), nprocs=2, start_method="spawn")


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
@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_sbi_recipe_on_two_gpus_over_nccl(ray_cluster, in_tmp: Path, cuda_graphs: bool) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    cfg = config.load(
        DEBUG,
        [f"run.name=sbi-ddp-{cuda_graphs}", "scaling.num_workers=2", "scaling.use_gpu=true",
         "tracking.enabled=false", "workload.simulation.device=cuda",
         f"precision.cuda_graphs={cuda_graphs}"],
    )  # fmt: skip
    outcome = launch.train(cfg)
    assert outcome.exit_code == 0 and outcome.num_workers == 2
    assert outcome.metrics["val/loss"] < 1.0


def test_a_step_that_cannot_be_captured_falls_back_to_eager() -> None:
    """nflows' NSF checks its spline domain with data-dependent Python branches; whether or
    not it captures, training must go on with the weights the warm-up found untouched."""
    device = torch.device("cuda", 0)
    theta, x = torch.randn(512, 2), torch.randn(512, 2)
    workload = SBIWorkload(SBIWorkloadConfig(estimator=EstimatorSection(model="nsf")), seed=0)
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
        loss, _ = step(batch)
    else:
        loss, _ = optimizer_step(
            model, [batch], workload, Precision("fp32", device), optimizer, 5.0
        )
    assert torch.isfinite(loss)


@pytest.mark.ray
@pytest.mark.parametrize("workers", [1, 2])
def test_streamed_sbi_recipe_on_gpus_with_cuda_graphs(
    ray_cluster, in_tmp: Path, workers: int
) -> None:
    """Simulations read from disk window by window (10 chunks of 500, windows of 1,000 rows),
    moved to the GPU by the loop's thread while the graph replays: the reader thread makes no
    CUDA call, so capture works, and DDP ranks make the same number of steps."""
    if torch.cuda.device_count() < workers:
        pytest.skip(f"needs {workers} GPUs")
    cfg = config.load(
        DEBUG,
        [f"run.name=sbi-stream-{workers}", f"scaling.num_workers={workers}",
         "scaling.use_gpu=true", "precision.cuda_graphs=true", "tracking.enabled=false",
         "workload.stream_from_disk=true", "workload.stream_window_rows=1000",
         "workload.simulation.chunk_size=500", "train.epochs=12",
         "workload.evaluation.c2st=false", "workload.evaluation.sbc_runs=0",
         "workload.evaluation.pair_plot=false"],
    )  # fmt: skip
    outcome = launch.train(cfg)
    assert outcome.exit_code == 0 and outcome.num_workers == workers
    assert outcome.metrics["val/loss"] < -0.8, outcome.metrics  # an untrained MAF: about 1.5
