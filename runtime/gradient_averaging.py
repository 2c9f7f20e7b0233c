"""The gradient all-reduce of a step captured as a CUDA graph on several GPUs, without DDP.

DDP copies every fresh gradient into its flat bucket before the bucket's all-reduce, with a
multiply by 1/world size on the way: a kernel per parameter, 58 in a graphed ResNet-18 step.
Here every gradient is all-reduced where autograd left
it, and nothing is copied:

- the parameters are cut into buckets of about ``BUCKET_MB``, in the order the backward pass
  produces their gradients (the reverse of the order the model registers them, as DDP starts
  out too);
- when a bucket's last gradient is accumulated (a post-accumulate-grad hook), its gradients go
  to the collective as one coalesced call: one group of in-place all-reduces, averaged by NCCL,
  launched while the backward pass goes on; buckets are launched in order, so every rank calls
  the same collectives in the same order;
- the backward pass's last callback launches what is left (a parameter that got no gradient
  contributes zeros) and makes the step's stream wait for every bucket.

On 2 H200s: the graphed ResNet-18 step under torchrun 104.9k
img/s against DDP's 103.7-104.2k in each of three interleaved repeats; whole `trainforge train`
commands 106.2-106.6k against 105.4-106.2k in each of four (2-GPU weak scaling 0.963 against
0.958); sbi's MAF (many small tensors, one collective each in the group) 2.19 ms a graphed
step, as with DDP.

A capture records the collectives like any other kernel: a replay all-reduces again. The eager
steps before the capture, and every step after a failed one, take the same path. As with DDP,
the steps run a wrapper (``AveragedModule``) whose every forward starts a new round, so a
backward cut short leaves nothing behind; ``distributed.unwrap`` takes it off, so the model that
is checkpointed, copied and logged carries no hook of it (the parameters' hooks are neither
copied nor pickled). Backends whose all-reduce cannot average (gloo: CPU tests) sum, and the
callback divides.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

BUCKET_MB = 10.0
"""A graphed step's backward pass is short (~5 ms for a ResNet-18 at batch 256 on an H200), so
the all-reduce of the last bucket, which waits for its end, weighs more than in eager steps:
10 MB buckets gave DDP 0.85-1.3% more than 25 MB on 4 GPUs in each of eight launches (5, 50
and 100 MB less), and gave this averager more than 25 MB on 2 GPUs."""

# torch 2.13 marks the call "will be deprecated" (FutureWarning) and offers no public
# replacement that groups in-place all-reduces; DDP's own reducer is C++
warnings.filterwarnings(
    "ignore", r"`torch\.distributed\.all_reduce_coalesced` will be deprecated", FutureWarning
)


class GradientAverager:
    """Averages ``model``'s gradients over the ranks of the default process group in every
    backward pass, from the moment it is made; makes the parameters and buffers rank 0's first
    (all ranks make one, with the same model). ``start_round`` before each forward."""

    def __init__(self, model: nn.Module, bucket_mb: float = BUCKET_MB) -> None:
        self.world_size = dist.get_world_size()
        self.op = dist.ReduceOp.AVG if dist.get_backend() == "nccl" else dist.ReduceOp.SUM
        params = [p for p in model.parameters() if p.requires_grad]
        with torch.no_grad():
            for tensor in [*params, *model.buffers()]:
                dist.broadcast(tensor, src=0)
        self.buckets: list[list[nn.Parameter]] = [[]]
        size = 0
        for param in reversed(params):
            if size >= bucket_mb * 2**20:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(param)
            size += param.numel() * param.element_size()
        self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.start_round()
        for param in params:
            param.register_post_accumulate_grad_hook(self._accumulated)

    def start_round(self) -> None:
        """Forget a backward pass that did not finish (a failed capture's)."""
        self.missing = [len(bucket) for bucket in self.buckets]
        self.launched = 0
        self.pending: list[Any] = []
        self.callback_queued = False

    def _accumulated(self, param: nn.Parameter) -> None:
        if not self.callback_queued:
            torch.autograd.Variable._execution_engine.queue_callback(self._finish)
            self.callback_queued = True
        self.missing[self.bucket_of[id(param)]] -= 1
        while self.launched < len(self.buckets) and self.missing[self.launched] == 0:
            self._launch()

    def _launch(self) -> None:
        bucket = self.buckets[self.launched]
        for param in bucket:
            if param.grad is None:  # no gradient this pass: it adds nothing to the others'
                param.grad = torch.zeros_like(param)
        grads = [param.grad for param in bucket]
        self.pending.append(dist.all_reduce_coalesced(grads, op=self.op, async_op=True))
        self.launched += 1

    def _finish(self) -> None:
        while self.launched < len(self.buckets):
            self._launch()
        for future in self.pending:
            future.wait()  # on a GPU: the current stream waits; the host does not
        if self.op == dist.ReduceOp.SUM:
            grads = [p.grad for bucket in self.buckets for p in bucket if p.grad is not None]
            torch._foreach_div_(grads, float(self.world_size))
        self.start_round()


class AveragedModule(nn.Module):
    """``module`` for the steps to run, its gradients averaged over the ranks of the default
    process group (``GradientAverager``); each forward starts a new round. All ranks make one,
    with the same model: its parameters and buffers become rank 0's."""

    averager_class: type[GradientAverager] = GradientAverager  # a bench's variant sets its own

    def __init__(self, module: nn.Module, bucket_mb: float = BUCKET_MB) -> None:
        super().__init__()
        self.module = module
        self.averager = self.averager_class(module, bucket_mb)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self.averager.start_round()
        return self.module(*args, **kwargs)
