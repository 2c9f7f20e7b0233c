"""What a data split is, for the loop: tensors batched by index on the device, chunks read
from disk a window at a time, or a map-style Dataset that goes through a DataLoader."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from trainforge.data.chunked import ChunkedData

Batch = tuple[torch.Tensor, ...]
"""One batch: a split's tensors, indexed alike and in the split's order. The data layer never
names them; each workload does (CNN: images, labels; SBI: θ and x, sbi's input and condition)."""


@dataclass(init=False, eq=False)
class TensorData:
    """A data split held as tensors of equal length (``TensorData(images, labels)``,
    ``TensorData(theta, x)``): kept on the accelerator when it fits and batched by index there,
    with no DataLoader and no host-to-device copy per step."""

    tensors: tuple[torch.Tensor, ...]

    def __init__(self, *tensors: torch.Tensor) -> None:
        if not tensors:
            raise ValueError("TensorData needs at least one tensor")
        lengths = [len(t) for t in tensors]
        if len(set(lengths)) > 1:
            raise ValueError(f"TensorData's tensors differ in length: {lengths}")
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    @property
    def device(self) -> torch.device:
        """Where the tensors are, and so where batches are indexed."""
        return self.tensors[0].device

    @property
    def nbytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)


# a map-style Dataset goes through a DataLoader; ChunkedData is read from disk window by window
Split = TensorData | ChunkedData | Dataset


def as_split(value: object, which: str) -> Split:
    """A workload's ``which`` split ("training", "validation") as the loop takes it: a tuple
    of equal-length tensors becomes ``TensorData``; anything else a split cannot be is a
    TypeError saying what it may be."""
    if isinstance(value, TensorData | ChunkedData | Dataset):
        return value
    if isinstance(value, tuple | list) and value and all(torch.is_tensor(t) for t in value):
        return TensorData(*value)
    raise TypeError(
        f"the {which} split is {type(value).__name__}: expected a tuple of equal-length "
        "tensors, trainforge.TensorData or a map-style torch Dataset"
    )


# Keep a data set on the GPU only when it leaves most of the memory to training.
DEVICE_MEMORY_FRACTION = 0.4


def keep_on_device(setting: str, nbytes: int, device: torch.device) -> bool:
    """Whether tensors of ``nbytes`` should live on ``device`` (then batches are gathered there,
    with no host-to-device copy per step), by a recipe's ``data_on_device`` setting:
    ``true``, ``false``, or ``auto`` (when they take less than 40% of the GPU's free memory).
    Never on a CPU device: there is nothing to move."""
    if device.type != "cuda" or setting == "false":
        return False
    if setting == "true":
        return True
    free, _ = torch.cuda.mem_get_info(device)
    return nbytes < DEVICE_MEMORY_FRACTION * free
