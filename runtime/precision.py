"""Mixed precision as one small object: autocast, backward, optimizer step, state.

bf16 needs no loss scaling; fp16 uses a GradScaler whose state is checkpointed. Gradients are
unscaled before the norm is measured or clipped, so clipping sees true gradient values.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
from torch import nn

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class Precision:
    def __init__(self, dtype: str, device: torch.device) -> None:
        self.dtype = DTYPES[dtype]
        self.device_type = device.type
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.dtype == torch.float16)

    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss).backward()

    def step(
        self,
        optimizer: torch.optim.Optimizer,
        parameters: list[nn.Parameter],
        clip_grad_norm: float | None,
        measure_norm: bool,
    ) -> torch.Tensor | None:
        """Unscale, clip (or just measure) the gradient norm, step, update the scale.

        Returns the pre-clip global gradient norm when clipping or asked to measure it.
        """
        norm = None
        if clip_grad_norm is not None or measure_norm:
            self.scaler.unscale_(optimizer)
            max_norm = clip_grad_norm if clip_grad_norm is not None else float("inf")
            norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm)
        self.scaler.step(optimizer)  # skips the step when fp16 gradients overflowed
        self.scaler.update()
        return norm

    def state_dict(self) -> dict[str, Any]:
        return self.scaler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state:
            self.scaler.load_state_dict(state)
