"""What DDP and NCCL options do to the weak scaling of trainforge's graphed CNN step.

At batch 256 per GPU a ResNet-18 step replayed as a CUDA graph takes ~5 ms on one H100, and on
4 GPUs ~0.5 ms more (weak scaling ~0.91): more than the all-reduce of its 45 MB of fp32
gradients would take alone at NCCL's measured bus bandwidth, so the cost is in how the
all-reduce shares the GPU with the backward pass. This runs trainforge's loop
(``bench/cnn_throughput.py``'s ``trainforge_loop``) under one torchrun launch for each DDP
option, in a rotating order per repeat, so they are compared on one host minutes apart:

- ``bucket<N>``: DDP's gradient bucket of N MB, DDP built as graphed steps had it until the
  thirty-ninth session (on the step's side stream; they had 10, eager steps 25): smaller
  buckets start earlier (every option below but ``own`` and ``flat`` is DDP so built);
- ``bf16``: gradients all-reduced in bf16 (DDP's ``bf16_compress_hook``): half the bytes;
- ``nobuffers``: no broadcast of BatchNorm's buffers from rank 0 before every forward;
- ``static``: DDP told the graph is static (``static_graph``: the same parameters get
  gradients every step, so its bookkeeping is set once);
- ``own<N>``: no DDP: the model in an ``AveragedModule``, its gradients averaged by hooks of its own
  (``trainforge.gradient_averaging``, shipped for graphed steps since the fortieth session with
  10 MB), N MB per bucket, each bucket's gradients reduced in place as one coalesced NCCL call
  launched from the parameters' post-accumulate-grad hooks (no copy into a flat bucket);
- ``flat<N>``: ``own<N>``'s buckets and hooks, but each bucket's gradients gathered into one
  flat tensor (one ``torch.cat``, one scale by 1/world size), all-reduced, and the parameters'
  gradients then views of it: no kernel per parameter into a bucket (DDP copies each fresh
  gradient into its bucket: 58 small kernels of a graphed ResNet-18 step, ~2%; thirty-eighth
  session) nor out of one (``all_reduce_coalesced`` copies each back);
- ``onestream``: 10 MB buckets, with the graphed step's capture on the stream DDP was built on
  and the eager steps run on (``distributed.step_stream``), as shipped from commit 791325d to
  27355d7; shipped now: a stream of its own (compare with ``bucket10``);
- ``avg``: 10 MB buckets averaged by NCCL itself (``ReduceOp.AVG`` in a comm hook) instead of
  DDP's multiply of each gradient by 1/world size as it copies it into its bucket;
- ``nocomm``: a diagnostic, not a training option: DDP's hook hands each bucket back without
  an all-reduce, so the run pays DDP's bookkeeping but no communication (each rank keeps its
  own gradients): the ceiling that any all-reduce setting could reach.

NCCL's own settings (e.g. ``NCCL_MAX_NCHANNELS``: fewer SMs taken from the backward pass) are
environment variables of the launch: run this once per setting.

Usage (GPU machine):  python -m torch.distributed.run --standalone --nproc_per_node=4 \
    bench/ddp_scaling_options.py --options bucket25 bucket10 bf16 nobuffers --out opts.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cnn_throughput import trainforge_loop

from trainforge import distributed
from trainforge.gradient_averaging import AveragedModule, GradientAverager
from trainforge.worker import step

PLAIN_WRAP = distributed.wrap
PLAIN_GRAPHED_STEP_INIT = step.GraphedStep.__init__


def capture_on_ddps_stream(self: step.GraphedStep, *args: Any, **kwargs: Any) -> None:
    """``onestream``'s ``GraphedStep.__init__``: the capture on DDP's stream, with the eager
    steps."""
    PLAIN_GRAPHED_STEP_INIT(self, *args, **kwargs)
    self.capture_stream = self.side


def local_gradients(state: Any, bucket: Any) -> torch.futures.Future:
    """A DDP comm hook that communicates nothing: the bucket's own gradients, at once."""
    done: torch.futures.Future = torch.futures.Future()
    done.set_result(bucket.buffer())
    return done


def averaged_by_nccl(state: Any, bucket: Any) -> torch.futures.Future:
    """A DDP comm hook that averages each bucket in NCCL's all-reduce (``ReduceOp.AVG``): with
    any hook DDP copies each gradient into its bucket, without one it multiplies each by 1/world
    size on the way (a kernel per parameter either way), and its own hook divides once more."""
    work = torch.distributed.all_reduce(
        bucket.buffer(), op=torch.distributed.ReduceOp.AVG, async_op=True
    )
    return work.get_future().then(lambda done: done.value()[0])


# DDP accepts a hook whose parameters are annotated with its own classes or not at all; this
# module's annotations are strings (``from __future__ import annotations``)
local_gradients.__annotations__ = {}
averaged_by_nccl.__annotations__ = {}


class FlatAllReduce(GradientAverager):
    """``flat<N>``: each bucket gathered by one ``torch.cat`` of its gradients in memory order,
    scaled by 1/world size, all-reduced in place; each parameter's gradient is then a view of
    the flat tensor with the parameter's own strides (channels_last convolutions included),
    which clipping and the optimizer read. Under capture the views are made once: every replay
    writes the backward's fresh gradients where the capture's were, and the flat tensors where
    theirs were. NCCL only (it sums what it scaled). Slower than ``own`` on 2 H200s (fortieth
    session)."""

    def _launch(self) -> None:
        bucket = self.buckets[self.launched]
        flat = torch.cat([torch.as_strided(p.grad, (p.numel(),), (1,)) for p in bucket])
        flat.mul_(1.0 / self.world_size)
        self.pending.append(torch.distributed.all_reduce(flat, async_op=True).get_future())
        offset = 0
        for p in bucket:
            p.grad = torch.as_strided(flat, p.shape, p.stride(), offset)
            offset += p.numel()
        self.launched += 1


class FlatModule(AveragedModule):
    """``AveragedModule`` with ``FlatAllReduce``'s buckets."""

    averager_class = FlatAllReduce


def graphed_ddp(model: torch.nn.Module, ctx: Any, bucket_mb: float) -> DistributedDataParallel:
    """DDP as graphed steps had it until the thirty-ninth session: rank 0's buffers once, no
    broadcast before every forward, gradients as bucket views, built on the side stream that
    the eager steps before capture run on (PyTorch's rule for capturing DDP's backward)."""
    distributed.broadcast_buffers(model)
    with distributed.on_step_stream(ctx.device):
        return DistributedDataParallel(
            model, device_ids=[ctx.device.index], **distributed.NO_FORWARD_BUFFER_SYNC,
            gradient_as_bucket_view=True, bucket_cap_mb=bucket_mb,
        )  # fmt: skip


def use(option: str) -> None:
    """Make ``distributed.wrap`` average gradients with ``option`` for the next run."""
    if option.startswith("bucket"):
        size = float(option[6:])
    else:  # the 10 MB graphed steps had where an option is compared with it, else DDP's 25
        size = 10.0 if option in ("onestream", "avg") else 25.0
    step.GraphedStep.__init__ = (  # type: ignore[method-assign]
        capture_on_ddps_stream if option == "onestream" else PLAIN_GRAPHED_STEP_INIT
    )

    def wrap(model: Any, ctx: Any, cuda_graphs: bool = False, **kwargs: Any) -> Any:
        if ctx.world_size == 1:
            return model
        if option.startswith("own"):
            return AveragedModule(model, float(option[3:]))
        if option.startswith("flat"):
            return FlatModule(model, float(option[4:]))
        if cuda_graphs:
            wrapped = graphed_ddp(model, ctx, size)
        else:  # --eager: DDP as eager steps have it
            distributed.BUCKET_CAP_MB = size
            wrapped = PLAIN_WRAP(model, ctx, cuda_graphs, **kwargs)
        if option == "bf16":
            wrapped.register_comm_hook(None, default_hooks.bf16_compress_hook)
        if option == "nobuffers":
            wrapped.broadcast_buffers = False
        if option == "static":
            wrapped._set_static_graph()
        if option == "avg":
            wrapped.register_comm_hook(None, averaged_by_nccl)
        if option == "nocomm":
            wrapped.register_comm_hook(None, local_gradients)
        return wrapped

    distributed.wrap = wrap  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, default=Path("ddp_scaling_options.json"))
    parser.add_argument("--options", nargs="+", default=["bucket25", "bucket10", "bf16"])
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--eager", action="store_true", help="eager steps instead of graphed")
    args = parser.parse_args()
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    torch.distributed.init_process_group("nccl", device_id=torch.device("cuda", local))
    rank = torch.distributed.get_rank()
    rows = []
    options = list(args.options)
    for repeat in range(args.repeats):
        shift = repeat % len(options)
        for option in options[shift:] + options[:shift]:
            use(option)
            rate = trainforge_loop(args.optimizer, args.batch, args.steps, not args.eager)
            rows.append({"option": option, "repeat": repeat, "samples_per_s": rate})
            torch.distributed.barrier()
            if rank == 0:
                print(f"[ddp] {option}, repeat {repeat}: {rate:,.0f} samples/s", flush=True)
    if rank == 0:
        medians = {
            option: statistics.median(r["samples_per_s"] for r in rows if r["option"] == option)
            for option in options
        }
        result = {
            "gpu": torch.cuda.get_device_name(0),
            "gpus": torch.distributed.get_world_size(),
            "torch": torch.__version__,
            "nccl_env": {
                k: v for k, v in os.environ.items() if k.startswith(("NCCL_", "CUDA_DEVICE_MAX"))
            },
            "settings": {k: v for k, v in vars(args).items() if k != "out"},
            "rows": rows,
            "medians": medians,
        }
        args.out.write_text(json.dumps(result, indent=2))
        print(json.dumps(medians))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
