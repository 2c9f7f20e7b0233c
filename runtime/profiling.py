"""Optional torch.profiler window on rank 0: profile N optimizer steps, save a Chrome trace
(open it in chrome://tracing or Perfetto) to see where a step's time goes."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from trainforge.distributed import WorkerContext


class StepProfiler:
    def __init__(self, steps: int, start_step: int, ctx: WorkerContext) -> None:
        self.steps = steps if ctx.is_main else 0
        self.start_step = start_step
        self.device = ctx.device
        self.profiler: profile | None = None
        self.trace: Path | None = None

    def after_step(self, global_step: int) -> None:
        """Call after each optimizer step; starts and stops the profiling window."""
        if not self.steps or self.trace is not None:
            return
        if self.profiler is None and global_step >= self.start_step:
            activities = [ProfilerActivity.CPU]
            if self.device.type == "cuda":
                activities.append(ProfilerActivity.CUDA)
            self.profiler = profile(activities=activities, record_shapes=True)
            self.profiler.__enter__()
            self.first = global_step
        elif self.profiler is not None and global_step - self.first >= self.steps:
            self.stop()

    def stop(self) -> None:
        if self.profiler is None or self.trace is not None:
            return
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        self.profiler.__exit__(None, None, None)
        self.trace = Path(tempfile.mkdtemp(prefix="trainforge-profile-")) / "trace_rank0.json"
        self.profiler.export_chrome_trace(str(self.trace))
