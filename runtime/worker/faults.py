"""Faults injected on purpose, so that tests produce on a CPU what happens on real hardware.
The driver puts them in the payload from environment variables (``trainforge.driver``)."""

from __future__ import annotations

from typing import Any

import torch

from trainforge.checkpoint import Position

OOM_AT_STEP = "oom_at_step"
"""Payload key: the optimizer step (1-based) during which the last rank runs out of memory."""


def inject(payload: dict[str, Any], trainer: Any) -> None:
    """Wrap ``trainer.step`` (the ``Stepper``) with the faults ``payload`` asks for."""
    at_step = payload.get(OOM_AT_STEP)
    if at_step is not None and trainer.ctx.rank == trainer.ctx.world_size - 1:
        trainer.step = OutOfMemoryAt(int(at_step), trainer.step, trainer.state.position)


class OutOfMemoryAt:
    """A step that raises ``torch.OutOfMemoryError`` (what CUDA raises) at one step."""

    def __init__(self, at_step: int, step: Any, position: Position) -> None:
        self.at_step, self.step, self.position = at_step, step, position

    def __call__(self, window: list[Any], measure_norm: bool = False) -> Any:
        if self.position.global_step + 1 == self.at_step:
            raise torch.OutOfMemoryError(
                "CUDA out of memory. Tried to allocate 20.00 GiB (injected at step "
                f"{self.at_step} by TRAINFORGE_OOM_AT_STEP)"
            )
        return self.step(window, measure_norm=measure_norm)
