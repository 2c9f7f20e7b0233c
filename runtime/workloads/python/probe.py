"""The driver's check of a user's workload before any worker starts: made, its model built,
its splits made on this CPU, and one small batch taken through ``loss``, ``eval_sums`` and
``summarize``. Whatever breaks the contract is one line naming the entry and what was
expected, instead of a traceback from every worker."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import torch
from torch.utils.data import Dataset, default_collate

from trainforge.data.chunked import ChunkedData
from trainforge.data.types import Batch, Split, TensorData, as_split
from trainforge.log import first_line
from trainforge.workloads.base import Workload
from trainforge.workloads.python.config import PythonWorkloadConfig
from trainforge.workloads.python.entry import WorkloadCodeError, make

PROBE_ROWS = 2  # a batch of two: a batch dimension that cannot hide as a squeezed one
T = TypeVar("T")


def check(cfg: PythonWorkloadConfig) -> None:
    """Raise WorkloadCodeError where the user's workload breaks its contract."""
    workload = make(cfg, seed=0)
    entry = cfg.entry
    model = _call(entry, "build_model()", workload.build_model)
    if not isinstance(model, torch.nn.Module):
        raise WorkloadCodeError(
            f"workload.entry: {entry}.build_model() returned {type(model).__name__}, not a "
            "torch.nn.Module"
        )
    splits = _call(entry, "datasets(device)", lambda: workload.datasets(torch.device("cpu")))
    if not isinstance(splits, tuple | list) or len(splits) != 2:
        raise WorkloadCodeError(
            f"workload.entry: {entry}.datasets(device) returned {type(splits).__name__}: "
            "expected (training split, validation split)"
        )
    train = _split(entry, splits[0], "training")
    val = _split(entry, splits[1], "validation")
    _check_loss(entry, workload, model, _first_rows(entry, train, "training"))
    _check_metrics(entry, workload, model, _first_rows(entry, val, "validation"))


def _split(entry: str, value: Any, which: str) -> Split:
    try:
        split = as_split(value, which)
    except (TypeError, ValueError) as exc:  # ValueError: TensorData of unequal lengths
        raise WorkloadCodeError(f"workload.entry: {entry}.datasets(device): {exc}") from None
    if len(split) < 1:  # type: ignore[arg-type]
        raise WorkloadCodeError(f"workload.entry: {entry}.datasets(device): the {which} split "
                                "is empty")  # fmt: skip
    return split


def _first_rows(entry: str, split: Split, which: str) -> Batch | None:
    """The split's first rows as a batch (None for chunked data on disk: not probed)."""
    if isinstance(split, ChunkedData):
        return None
    if isinstance(split, TensorData):
        return tuple(t[:PROBE_ROWS] for t in split.tensors)
    assert isinstance(split, Dataset)
    rows = min(PROBE_ROWS, len(split))  # type: ignore[arg-type]
    samples = _call(entry, f"{which} dataset[i]", lambda: [split[i] for i in range(rows)])
    if not all(isinstance(s, tuple | list) and all(map(torch.is_tensor, s)) for s in samples):
        raise WorkloadCodeError(
            f"workload.entry: {entry}.datasets(device): the {which} Dataset's items are "
            f"{type(samples[0]).__name__}: expected tuples of tensors (a batch is the tuple's "
            "tensors, stacked)"
        )
    return tuple(default_collate(samples))


def _check_loss(
    entry: str, workload: Workload, model: torch.nn.Module, batch: Batch | None
) -> None:
    if batch is None:
        return
    prepared = _prepared(entry, workload, batch, train=True)
    loss = _call(entry, "loss(model, batch)", lambda: workload.loss(model, prepared))
    if not torch.is_tensor(loss) or loss.numel() != 1 or not loss.is_floating_point():
        shape = tuple(loss.shape) if torch.is_tensor(loss) else type(loss).__name__
        raise WorkloadCodeError(
            f"workload.entry: {entry}.loss(model, batch) returned {shape}: expected the batch's "
            "mean loss, a floating-point tensor of one element"
        )
    if not loss.requires_grad:
        raise WorkloadCodeError(
            f"workload.entry: {entry}.loss(model, batch) does not depend on the model's "
            "parameters (no gradient flows to them): it must be computed from model(…)"
        )


def _check_metrics(
    entry: str, workload: Workload, model: torch.nn.Module, batch: Batch | None
) -> None:
    if batch is None:
        return
    prepared = _prepared(entry, workload, batch, train=False)
    with torch.no_grad():
        sums = _call(entry, "eval_sums(model, batch)", lambda: workload.eval_sums(model, prepared))
    if not isinstance(sums, dict) or not all(torch.is_tensor(v) for v in sums.values()):
        raise WorkloadCodeError(
            f"workload.entry: {entry}.eval_sums(model, batch) returned {type(sums).__name__}: "
            "expected a dict of tensors (summed over batches and workers)"
        )
    metrics = _call(entry, "summarize(sums)", lambda: workload.summarize(sums))
    if not isinstance(metrics, dict) or not all(
        isinstance(k, str) and isinstance(v, int | float) for k, v in metrics.items()
    ):
        raise WorkloadCodeError(
            f"workload.entry: {entry}.summarize(sums) returned {metrics!r:.80}: expected a dict "
            "of metric names to numbers"
        )


def _prepared(entry: str, workload: Workload, batch: Batch, train: bool) -> Batch:
    return _call(entry, f"prepare_batch(batch, train={train})",
                 lambda: workload.prepare_batch(batch, train=train))  # fmt: skip


def _call(entry: str, what: str, function: Callable[[], T]) -> T:
    try:
        return function()
    except WorkloadCodeError:
        raise
    except Exception as exc:  # the user's code: theirs to see, in one line
        raise WorkloadCodeError(
            f"workload.entry: {entry}.{what} raised {type(exc).__name__}: {first_line(exc)}"
        ) from exc
