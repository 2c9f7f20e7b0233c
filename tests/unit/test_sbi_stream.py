"""Simulations streamed from disk (trainforge.workloads.sbi.stream): the same split as in memory,
invalid rows dropped the same way, and z-score statistics of the whole training set."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sbi.utils.sbiutils import z_standardization

from tests.unit.sbi_helpers import DEBUG, write_simulations
from trainforge import config
from trainforge.data.chunked import ChunkedData
from trainforge.data.types import TensorData
from trainforge.workloads.sbi import estimator as estimators
from trainforge.workloads.sbi import simulations, stream
from trainforge.workloads.sbi.tasks import get_task
from trainforge.workloads.sbi.workload import SBIWorkload, split


def by_rows(theta: torch.Tensor) -> torch.Tensor:
    return theta[torch.argsort(theta[:, 0])]


def streamed_rows(job: stream.StreamPlan, rows: list[torch.Tensor]) -> torch.Tensor:
    split = ChunkedData(job.files, rows, simulations.read_chunk, window_rows=1)
    return by_rows(split.read_rows(list(range(len(rows))))[0])


@pytest.mark.parametrize("nan_rows", [0, 37])
def test_the_streamed_split_is_the_in_memory_split(tmp_path: Path, nan_rows: int) -> None:
    folder = write_simulations(tmp_path / "sims", n=2300, chunk_size=500, nan_rows=nan_rows)
    theta, x = simulations.load(folder, drop_invalid=True)
    (train_theta, _), (val_theta, _) = split(theta, x, val_fraction=0.1, seed=3)
    job = stream.plan(folder, val_fraction=0.1, seed=3, drop_invalid=True)
    assert (job.num_train, job.num_val) == (len(train_theta), len(val_theta))
    assert torch.equal(streamed_rows(job, job.train_rows), by_rows(train_theta))
    assert torch.equal(streamed_rows(job, job.val_rows), by_rows(val_theta))


def test_invalid_simulations_are_refused_unless_dropped(tmp_path: Path) -> None:
    folder = write_simulations(tmp_path / "sims", n=1000, chunk_size=300, nan_rows=5)
    with pytest.raises(Exception, match="5 of 1,000 simulations have NaN or inf"):
        stream.plan(folder, val_fraction=0.1, seed=0, drop_invalid=False)


@pytest.mark.parametrize("structured", [False, True])
def test_the_stand_in_carries_the_whole_training_sets_z_scores(structured: bool) -> None:
    data = torch.randn(10_000, 6) * torch.arange(1.0, 7.0) + torch.arange(6.0)
    moments = stream.Moments()
    for part in data.split(777):  # merged chunk by chunk
        moments.add(part)
    want_mean, want_std = z_standardization(data, structured)
    mean, std = z_standardization(moments.stand_in(structured), structured)
    torch.testing.assert_close(mean, want_mean, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(std, want_std, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("model", ["maf", "nsf", "mdn"])
def test_an_estimator_built_from_stand_ins_equals_one_built_from_all_data(model: str) -> None:
    generator = torch.Generator().manual_seed(1)
    task = get_task("two_moons")
    theta = task.prior_sample(5000, generator)
    x = task.simulate(theta, generator)
    moments = [stream.Moments(), stream.Moments()]
    for t, xs in zip(theta.split(1000), x.split(1000), strict=True):
        moments[0].add(t)
        moments[1].add(xs)
    cfg = config.load(DEBUG, [f"workload.estimator.model={model}"]).workload.estimator
    record = estimators.BuildRecord.from_config(cfg, 2, 2)
    torch.manual_seed(0)
    full = estimators.build(record, theta, x)
    torch.manual_seed(0)
    stand_in = estimators.build(record, moments[0].stand_in(False), moments[1].stand_in(False))
    with torch.no_grad():
        torch.testing.assert_close(
            stand_in.loss(theta[:200], condition=x[:200]),
            full.loss(theta[:200], condition=x[:200]),
            rtol=1e-4, atol=1e-4,
        )  # fmt: skip


def test_the_workload_streams_when_asked_with_the_same_sizes(tmp_path: Path) -> None:
    folder = write_simulations(tmp_path / "sims", n=3000, chunk_size=400)
    sizes = {}
    for streaming in ("false", "true"):
        cfg = config.load(DEBUG, [f"workload.stream_from_disk={streaming}"])
        cfg.workload.simulation.path = str(folder)
        workload = SBIWorkload(cfg.workload, seed=0)
        train, val = workload.datasets(torch.device("cpu"))
        assert isinstance(train, ChunkedData if streaming == "true" else TensorData)
        assert isinstance(val, TensorData)  # validation rows fit in memory
        assert ("streamed" in workload.describe()) == (streaming == "true")
        sizes[streaming] = (len(train), len(val))
        workload.build_model()
    assert sizes["true"] == sizes["false"] == (2700, 300)
