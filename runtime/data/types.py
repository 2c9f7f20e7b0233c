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
