"""What a data split is, for the loop: tensors batched by index on the device, chunks read
from disk a window at a time, or a map-style Dataset that goes through a DataLoader."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset

from trainforge.data.chunked import ChunkedData


@dataclass
class TensorData:
    """A data split held as tensors: kept on the accelerator when it fits and batched by
    index there, with no DataLoader and no host-to-device copy per step."""

    inputs: torch.Tensor
    targets: torch.Tensor

    def __len__(self) -> int:
        return len(self.targets)


# a map-style Dataset goes through a DataLoader; ChunkedData is read from disk window by window
Split = TensorData | ChunkedData | Dataset

Batch = tuple[torch.Tensor, torch.Tensor]

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
