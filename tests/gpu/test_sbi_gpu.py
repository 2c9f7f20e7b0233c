"""GPU tier for SBI: the CUDA-graph optimizer step against the eager one, and SBI recipes on
GPUs through Ray Train (simulation on the GPU, one worker with CUDA graphs, two over NCCL)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from torch import nn

from tests.gpu.ranks import flat_parameters, gather, run_on_gpus
from trainforge import checkpoint, config, distributed
from trainforge.distributed import WorkerContext
from trainforge.driver import launch, stage
from trainforge.optim import build_optimizer
from trainforge.precision import Precision
from trainforge.worker.step import GraphedStep, optimizer_step
from trainforge.workloads.sbi import load_posterior, simulations
from trainforge.workloads.sbi.config import SBIWorkloadConfig
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
    """The same 16 optimizer steps, eager and replayed from a CUDA graph (on several ranks when
    a context of several is given: eager under DDP, graphed with its own all-reduce): (eager
    losses, graphed losses, the two models)."""
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
    step = GraphedStep(graph_step, workload, graph_opt, 5.0, precision.autocast)
    graphed = []
    for b in batches:
        stepped = step(b)
        assert stepped is not None, step.error
        graphed.append(stepped[0].item())
    assert step.captured  # its first steps eager (3), then replays
    return eager, graphed, eager_model, graph_model


def assert_same_training(
    eager: list[float], graphed: list[float], eager_model: nn.Module, graph_model: nn.Module
) -> None:
    # the same first loss: the graphed step's first steps are the run's first steps
    assert graphed[0] == pytest.approx(eager[0], rel=1e-5)
    assert graphed == pytest.approx(eager, rel=2e-3, abs=2e-3)
    for a, b in zip(eager_model.parameters(), graph_model.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)


def test_graphed_step_matches_the_eager_step() -> None:
    assert_same_training(*eager_and_graphed_losses(torch.device("cuda", 0)))


def test_a_failed_capture_leaves_the_thread_on_its_own_stream() -> None:
    """nflows' NSF cannot be captured (``torch.any`` of a device tensor needs the host). When
    the capture's end raises, torch's graph context never leaves its stream: the step puts the
    thread back on the stream it was on, so later work (the eager steps' inputs, evaluation)
    stays ordered with the default stream's."""
    device = torch.device("cuda", 0)
    workload, batches = two_moons_steps(device)
    workload.cfg.estimator.model = "nsf"
    torch.manual_seed(0)
    model = workload.build_model().to(device)
    train = OmegaConf.create({"optimizer": "adam", "lr": 1e-3, "weight_decay": 0.0})
    optimizer = build_optimizer(model, train, capturable=True)
    step = GraphedStep(model, workload, optimizer, 5.0, Precision("fp32", device).autocast)
    before = torch.cuda.current_stream(device)
    results = [step(b) for b in batches[:4]]  # 3 eager steps, then the capture
    assert all(r is not None for r in results[:3])
    assert results[3] is None and step.error and not step.captured
    assert torch.cuda.current_stream(device) == before
    # the device's generator left capture mode: the posterior can still be sampled
    assert torch.randn(4, device=device).isfinite().all()


def _ddp_rank(ctx: WorkerContext) -> None:
    eager, graphed, eager_model, graph_model = eager_and_graphed_losses(
        ctx.device, batches_from=4096 * ctx.rank, ctx=ctx
    )
    assert_same_training(eager, graphed, eager_model, graph_model)
    # the captured all-reduce kept the ranks identical, as DDP does
    everyone = gather(flat_parameters(graph_model), ctx.world_size)
    for other in everyone[1:]:
        torch.testing.assert_close(other, everyone[0], rtol=0, atol=0)
    first_losses = gather(torch.tensor(eager[:1], device=ctx.device), ctx.world_size)
    assert first_losses[0].item() != first_losses[1].item()  # the ranks saw different batches


def test_graphed_ddp_step_matches_the_eager_ddp_step() -> None:
    """The gradient all-reduce captured inside the graph (``gradient_averaging``): on two GPUs,
    each rank's losses and weights follow eager DDP's, and the ranks' weights stay bitwise
    equal."""
    run_on_gpus(_ddp_rank)


def test_the_evaluation_samples_the_posterior_on_the_gpu(tmp_path: Path) -> None:
    """A built-in task's posterior samples on the training device, its prior rebuilt there:
    the same truncated distribution as on the CPU (a C2ST of the two near chance), and the
    evaluation's C2ST and SBC from it."""
    from trainforge.workloads.sbi import estimator as estimators
    from trainforge.workloads.sbi import evaluate, sources
    from trainforge.workloads.sbi.c2st import c2st

    cfg = config.load(DEBUG, ["workload.evaluation.num_samples=2000"]).workload
    source = sources.resolve(cfg)
    generator = torch.Generator().manual_seed(0)
    theta = source.sample_prior(2000, generator)
    record = estimators.BuildRecord.from_config(cfg.estimator, 2, 2)
    estimator = estimators.build(record, theta, source.simulate(theta, generator)).eval()
    _, x_obs = get_task("two_moons").observation(1)
    gpu = torch.device("cuda", 0)

    on_gpu = evaluate.posterior_of(copy.deepcopy(estimator), source, gpu)
    gpu_samples = on_gpu.sample((4000,), x=x_obs.to(gpu), show_progress_bars=False)
    assert gpu_samples.device == gpu
    on_cpu = evaluate.posterior_of(estimator, source)
    cpu_samples = on_cpu.sample((4000,), x=x_obs, show_progress_bars=False)
    assert bool(((gpu_samples >= -1) & (gpu_samples <= 1)).all())  # the prior's box
    assert c2st(cpu_samples, gpu_samples.cpu(), seed=0) < 0.55

    metrics, files = evaluate.run(
        copy.deepcopy(estimator), source, cfg.evaluation, 0, tmp_path, gpu
    )
    assert 0.5 <= metrics["c2st/obs1"] <= 1.0
    assert 0.0 <= metrics["sbc/ks_pvalue_min"] <= 1.0
    assert (tmp_path / "sbc.png").stat().st_size > 0 and tmp_path / "sbc.png" in files


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
    # the stage's tasks ran in one process for the GPU (a new one each took seconds apiece)
    (entry,) = (in_tmp / "runs" / "simulations").iterdir()
    ran_on = simulations.read_manifest(entry)["ran_on"]
    assert [node["processes"] for node in ran_on.values()] == [1], ran_on
    _, x_obs = get_task("two_moons").observation(1)
    assert posterior.sample((100,), x=x_obs, show_progress_bars=False).shape == (100, 2)


@pytest.mark.ray
def test_a_gpu_stage_waits_for_a_gpu_that_other_work_holds_and_says_so(
    ray_cluster, in_tmp: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every GPU held by other work (another run's worker): the stage starts one process, which
    says what it waits for and simulates once the GPU is free. (With some GPUs free it goes on
    with those: tests/integration/test_sbi.py, with CPUs.)"""
    import threading

    import ray

    cfg = config.load(
        DEBUG, ["workload.simulation.device=cuda", "workload.simulation.num_simulations=5000"]
    )
    # any actor of an importable class holds a GPU as another run's worker would
    holder = ray.remote(num_gpus=1)(stage.StageProcess)
    holders = [holder.remote() for _ in range(torch.cuda.device_count())]
    ray.get([held.__ray_ready__.remote() for held in holders])
    for held in holders:
        threading.Timer(5.0, ray.kill, [held]).start()  # the other work ends after a while
    entry = launch.prepare_data(cfg).simulation.path
    said = capsys.readouterr().out
    assert "simulations: waiting for a GPU that other work holds on the cluster" in said, said
    gpus = torch.cuda.device_count()
    got = "1 GPU" if gpus == 1 else f"1 GPU of {gpus} (the others held by other work at its start)"
    assert f"to simulate for 5,000 two_moons simulations on {got} →" in said, said
    ran_on = simulations.read_manifest(Path(entry))["ran_on"]
    assert [node["processes"] for node in ran_on.values()] == [1], ran_on


@pytest.mark.ray
@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_sbi_recipe_on_two_gpus_over_nccl(
    ray_cluster, in_tmp: Path, cuda_graphs: bool, capfd: pytest.CaptureFixture[str]
) -> None:
    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    cfg = config.load(
        DEBUG,
        [f"run.name=sbi-ddp-{cuda_graphs}", "scaling.num_workers=2", "scaling.use_gpu=true",
         "tracking.enabled=false", "workload.simulation.device=cuda",
         f"precision.cuda_graphs={cuda_graphs}"],
    )  # fmt: skip
    outcome = launch.train(cfg)
    assert outcome.exit_code == 0
    assert (outcome.backend, outcome.num_workers) == ("nccl", 2)  # as the workers reported
    # the bars of the same recipe on two CPU workers (tests/integration/test_sbi.py)
    assert outcome.metrics["val/loss"] < -1.0, outcome.metrics
    assert outcome.metrics["c2st/obs1"] < 0.9, outcome.metrics
    # Ray Train's process group has no bound device: the loop's barriers name theirs
    # (distributed.barrier), so torch's warning does not reach the user's console
    assert "barrier(): using the device" not in "".join(capfd.readouterr())


@pytest.mark.ray
@pytest.mark.parametrize("workers", [1, 2])
def test_a_step_that_cannot_be_captured_falls_back_to_eager(
    ray_cluster, in_tmp: Path, workers: int
) -> None:
    """nflows' NSF asks ``torch.any`` of a device tensor in every spline (its inside-the-
    interval mask), which needs the host: capture fails. The loop says so in one line and goes
    on with eager steps, from the batch the capture failed on, after the graphed step's own 3
    eager steps: the run is the eager run, the same steps and the same losses (a step lost or
    taken twice would show as a few % of val/loss; on two GPUs the eager run is DDP's and the
    graphed run's gradients are averaged by its own hooks). Those eager steps stay on the
    stream of the gradient accumulators: no warning from torch that they do not."""
    if torch.cuda.device_count() < workers:
        pytest.skip(f"needs {workers} GPUs")
    common = [
        f"scaling.num_workers={workers}", "scaling.use_gpu=true", "workload.estimator.model=nsf",
        "workload.simulation.device=cuda", "tracking.enabled=false", "train.max_steps=60",
        "train.log_every_steps=20", "workload.evaluation.c2st=false",
        "workload.evaluation.sbc_runs=0", "workload.evaluation.pair_plot=false",
    ]  # fmt: skip
    outcomes, logs = {}, {}
    for graphs in ("true", "false"):
        name = f"nsf-graphs-{graphs}"
        cfg = config.load(DEBUG, [f"run.name={name}", f"precision.cuda_graphs={graphs}", *common])
        outcomes[graphs] = launch.train(cfg)
        assert outcomes[graphs].exit_code == 0
        logs[graphs] = (in_tmp / "runs" / name / "worker-output.log").read_text()
    notes = [line for line in logs["true"].splitlines() if "CUDA graph capture failed" in line]
    assert len(notes) == 1, logs["true"]
    assert "[trainforge] CUDA graph capture failed, eager steps: " in notes[0]
    assert "CUDA graph capture failed" not in logs["false"]
    assert "stream does not match" not in logs["true"]

    fell_back, eager = outcomes["true"], outcomes["false"]
    assert fell_back.backend == eager.backend == "nccl"
    for outcome in (fell_back, eager):
        assert outcome.checkpoint_path is not None
        assert checkpoint.load(outcome.checkpoint_path)["global_step"] == 60
    for key in ("train/loss", "train/epoch_loss", "val/loss"):
        assert fell_back.metrics[key] == pytest.approx(eager.metrics[key], rel=2e-3, abs=2e-3), key
    # it trained: the last 20 steps' mean loss is below the mean over all 60
    assert eager.metrics["train/loss"] < eager.metrics["train/epoch_loss"]


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
